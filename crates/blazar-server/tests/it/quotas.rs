//! Per-project quotas: the API that shows and sets them, each limit refused with its reason
//! (creates 403, updates 400, dry runs alike), the monthly host-hour budget with weights
//! across a month boundary, and racing creates that never take a project past its quota.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::TestApp;

fn hosts(n: i64, props: &str) -> Value {
    json!({"resource_type": "physical:host", "min": n, "max": n,
           "hypervisor_properties": "", "resource_properties": props})
}

/// One ranged host reservation, `min` to `max` of any hosts.
fn ranged(min: i64, max: i64) -> Value {
    json!([{"resource_type": "physical:host", "min": min, "max": max,
            "hypervisor_properties": "", "resource_properties": ""}])
}

fn lease(name: &str, start: &str, end: &str, reservations: Value) -> Value {
    json!({"name": name, "start_date": start, "end_date": end, "events": [],
           "reservations": reservations})
}

fn id_of(r: &crate::harness::Response) -> String {
    r.body["lease"]["id"].as_str().unwrap().to_string()
}

async fn app_with_hosts(n: usize, set: impl FnOnce(&mut blazar_server::config::Cli)) -> TestApp {
    let app = TestApp::builder().configure(set).spawn().await;
    for i in 0..n {
        app.create_host(&format!("h{i}"), json!({})).await;
    }
    app
}

/// Two hosts and two floating IPs of `net-1`, with quotas of three instance slots and one
/// floating IP, acting as a member of project alpha.
async fn app_with_instance_and_address_quotas() -> TestApp {
    let mut app = app_with_hosts(2, |cli| {
        cli.quota_instances = Some(3);
        cli.quota_floatingips = Some(1);
    })
    .await;
    for address in ["10.0.0.5", "10.0.0.6"] {
        crate::inventory::fip(&app, "net-1", address).await;
    }
    app.act_as("alpha", "u1", "member");
    app
}

/// `amount` one-vCPU instances.
fn instances(amount: i64) -> Value {
    json!([{"resource_type": "virtual:instance", "amount": amount, "vcpus": 1,
            "memory_mb": 512, "disk_gb": 1, "affinity": null, "resource_properties": ""}])
}

/// One floating IP of `net-1`.
fn address() -> Value {
    json!([{"resource_type": "virtual:floatingip", "network_id": "net-1", "amount": 1}])
}

/// The one quota reason of a refusal.
fn quota_reason(r: &crate::harness::Response) -> Value {
    let reasons = r.body["reasons"].as_array().expect("reasons");
    assert_eq!(reasons.len(), 1, "{}", r.body);
    reasons[0]["quota"].clone()
}

#[tokio::test]
async fn quotas_are_shown_set_and_removed_by_admins_and_read_by_their_project() {
    let mut app = app_with_hosts(1, |cli| {
        cli.quota_hosts = Some(4);
        cli.quota_max_lease_duration = Some(604_800);
    })
    .await;

    let r = app.get("/v1/quotas/alpha").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let q = &r.body["quota"];
    assert_eq!(q["project_id"], "alpha");
    assert_eq!(q["hosts"], 4);
    assert_eq!(q["floatingips"], -1);
    assert_eq!(q["max_lease_duration"], 604_800);
    assert_eq!(q["overrides"], json!({}));
    assert_eq!(q["usage"]["hosts"], 0);
    assert_eq!(app.get("/v1/quotas").await.body, json!({"quotas": []}));

    let r = app
        .put(
            "/v1/quotas/alpha",
            json!({"hosts": 2, "host_hours_per_month": 100, "max_lease_duration": -1}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let q = &r.body["quota"];
    assert_eq!(q["hosts"], 2);
    assert_eq!(q["host_hours_per_month"], 100);
    assert_eq!(q["max_lease_duration"], -1);
    assert_eq!(
        q["overrides"],
        json!({"hosts": 2, "host_hours_per_month": 100, "max_lease_duration": -1})
    );
    // A project id Keystone could not have made is refused, and nothing is written.
    for bad in ["%00", &"p".repeat(65)] {
        let r = app
            .put(&format!("/v1/quotas/{bad}"), json!({"hosts": 1}))
            .await;
        r.assert_status(StatusCode::BAD_REQUEST);
        assert!(r.message().contains("Invalid project id"), "{}", r.body);
        // Nor shown the defaults, as if it were a project.
        let r = app.get(&format!("/v1/quotas/{bad}")).await;
        r.assert_status(StatusCode::BAD_REQUEST);
        assert!(r.message().contains("Invalid project id"), "{}", r.body);
    }
    assert_eq!(
        app.get("/v1/quotas").await.body["quotas"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // null clears one override; the others stay.
    let r = app
        .put("/v1/quotas/alpha", json!({"max_lease_duration": null}))
        .await;
    assert_eq!(r.body["quota"]["max_lease_duration"], 604_800);
    assert_eq!(
        r.body["quota"]["overrides"],
        json!({"hosts": 2, "host_hours_per_month": 100})
    );
    app.put("/v1/quotas/beta", json!({"floatingips": 1})).await;

    for (body, field) in [
        (json!({"hosts": -2}), "hosts"),
        (json!({"hosts": 1.5}), "hosts"),
        (json!({"hosts": "3"}), "hosts"),
        (json!({"vcpus": 3}), "vcpus"),
    ] {
        let r = app.put("/v1/quotas/alpha", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert_eq!(r.body["reasons"], json!([{"field": field}]), "{body}");
    }
    let r = app.put("/v1/quotas/alpha", json!({})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);

    let listed: Vec<Value> = app.get("/v1/quotas").await.body["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["project_id"].clone())
        .collect();
    assert_eq!(listed, [json!("alpha"), json!("beta")]);

    // A project's reader sees its own quota, and only its own; writes are for admins.
    app.act_as("alpha", "u1", "reader");
    assert_eq!(app.get("/v1/quotas/alpha").await.status, StatusCode::OK);
    let r = app.get("/v1/quotas/beta").await;
    r.assert_denied("blazar:quotas:get");
    let mine: Vec<Value> = app.get("/v1/quotas").await.body["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["project_id"].clone())
        .collect();
    assert_eq!(mine, [json!("alpha")]);
    app.act_as("alpha", "u1", "member");
    // Refused before the body is read, whatever it holds.
    for body in [json!({"hosts": 9}), json!({}), json!({"hosts": "abc"})] {
        app.put("/v1/quotas/alpha", body)
            .await
            .assert_denied("blazar:quotas:put");
    }
    app.delete("/v1/quotas/alpha")
        .await
        .assert_denied("blazar:quotas:delete");

    app.act_as_admin();
    assert_eq!(
        app.delete("/v1/quotas/alpha").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.delete("/v1/quotas/alpha").await.status,
        StatusCode::NOT_FOUND
    );
    let r = app.get("/v1/quotas/alpha").await;
    assert_eq!(r.body["quota"]["hosts"], 4);
    assert_eq!(r.body["quota"]["overrides"], json!({}));
}

#[tokio::test]
async fn host_quota_counts_the_peak_over_the_window_not_the_sum() {
    // Five hosts, so that the last create fits wherever b was placed (on a's host or not;
    // on PostgreSQL a host another writer holds a claim on is passed over).
    let mut app = app_with_hosts(5, |_| {}).await;
    app.put("/v1/quotas/alpha", json!({"hosts": 2})).await;
    app.act_as("alpha", "u1", "member");
    for (name, start, end) in [
        ("a", "2030-01-01 10:00", "2030-01-01 12:00"),
        ("b", "2030-01-01 12:00", "2030-01-01 14:00"),
        // Overlaps a, then b: never more than two at once.
        ("c", "2030-01-01 10:00", "2030-01-01 14:00"),
    ] {
        let r = app
            .post("/v1/leases", lease(name, start, end, json!([hosts(1, "")])))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{name}: {}", r.body);
    }
    let third = lease(
        "d",
        "2030-01-01 11:00",
        "2030-01-01 13:00",
        json!([hosts(1, "")]),
    );
    for path in ["/v1/leases?dry_run=true", "/v1/leases"] {
        let r = app.post(path, third.clone()).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {}", r.body);
        assert_eq!(r.body["error_code"], 403);
        assert_eq!(
            r.message(),
            "Quota hosts of project alpha exceeded: 2 host(s) reserved at 2030-01-01 11:00 \
             and 1 requested, the limit is 2"
        );
        assert_eq!(
            quota_reason(&r),
            json!({"name": "hosts", "limit": 2, "in_use": 2, "requested": 1,
                   "at": "2030-01-01T11:00:00.000000"})
        );
    }
    // Another project is not counted; an override of -1 lifts the limit.
    app.act_as("beta", "u2", "member");
    let r = app.post("/v1/leases", third.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as_admin();
    app.put("/v1/quotas/alpha", json!({"hosts": -1})).await;
    app.act_as("alpha", "u1", "member");
    let r = app.post("/v1/leases", third).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app.get("/v1/quotas/alpha").await;
    assert_eq!(r.body["quota"]["usage"]["hosts"], 0, "nothing is held now");
}

/// A reservation that lost its host still holds its grant: healing gives it back without
/// asking the quota again, so the project may not book that room meanwhile.
#[tokio::test]
async fn a_degraded_reservation_still_counts_toward_its_project_quota() {
    let mut app = app_with_hosts(0, |_| {}).await;
    let rack_a = app.create_host("ha", json!({"rack": "a"})).await;
    app.create_host("hb", json!({"rack": "b"})).await;
    app.put("/v1/quotas/alpha", json!({"hosts": 1})).await;
    app.act_as("alpha", "u1", "member");
    let on = |rack: &str| json!([hosts(1, &format!(r#"["==", "$rack", "{rack}"]"#))]);
    let (start, end) = ("2029-12-31 09:00", "2029-12-31 11:00");
    let r = app
        .post("/v1/leases", lease("a", start, end, on("a")))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let a = id_of(&r);
    app.act_as_admin();
    let r = app
        .put(
            &format!("/v1/os-hosts/{rack_a}"),
            json!({"reservable": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app.get(&format!("/v1/leases/{a}")).await;
    assert_eq!(r.body["lease"]["degraded"], true, "{}", r.body);

    app.act_as("alpha", "u1", "member");
    let b = lease("b", start, end, on("b"));
    let r = app.post("/v1/leases", b.clone()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        quota_reason(&r),
        json!({"name": "hosts", "limit": 1, "in_use": 1, "requested": 1,
               "at": "2029-12-31T09:00:00.000000"})
    );
    // Searches keep to it too: the first window offered is after the degraded lease.
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": on("b"), "duration": 120, "limit": 1}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.body["offers"][0]["start_date"], "2029-12-31T11:00:00.000000",
        "{}",
        r.body
    );

    app.act_as_admin();
    app.put(
        &format!("/v1/os-hosts/{rack_a}"),
        json!({"reservable": true}),
    )
    .await;
    let r = app.get(&format!("/v1/leases/{a}")).await;
    assert_eq!(r.body["lease"]["degraded"], false, "healed: {}", r.body);
    let r = app.get("/v1/os-hosts/allocations").await;
    let held: usize = r.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reservations"].as_array().unwrap().len())
        .sum();
    assert_eq!(held, 1, "alpha holds one host: {}", r.body);
}

#[tokio::test]
async fn instance_and_floating_ip_quotas_refuse_with_their_reason() {
    let app = app_with_instance_and_address_quotas().await;
    let address = address();
    let r = app
        .post(
            "/v1/leases",
            lease("i1", "2030-01-01 10:00", "2030-01-01 12:00", instances(2)),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app
        .post(
            "/v1/leases",
            lease("i2", "2030-01-01 11:00", "2030-01-01 13:00", instances(2)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        quota_reason(&r),
        json!({"name": "instances", "limit": 3, "in_use": 2, "requested": 2,
               "at": "2030-01-01T11:00:00.000000"})
    );
    let r = app
        .post(
            "/v1/leases",
            lease(
                "f1",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                address.clone(),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "f2",
                "2030-01-01 11:59",
                "2030-01-01 13:00",
                address.clone(),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(quota_reason(&r)["name"], "floatingips");
    assert_eq!(quota_reason(&r)["in_use"], 1);
    // Back to back is not at once.
    let r = app
        .post(
            "/v1/leases",
            lease("f3", "2030-01-01 12:00", "2030-01-01 13:00", address),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn lease_duration_and_start_ahead_quotas_refuse_creates() {
    // The clock stands at 2029-12-31 08:00.
    let mut app = app_with_hosts(1, |cli| {
        cli.quota_max_lease_duration = Some(86_400);
        cli.quota_max_start_ahead = Some(7 * 86_400);
    })
    .await;
    app.act_as("alpha", "u1", "member");
    let r = app
        .post(
            "/v1/leases",
            lease("long", "2030-01-01 10:00", "2030-01-02 10:01", json!([])),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        r.message(),
        "Quota max_lease_duration of project alpha exceeded: the lease would last 86460 \
         second(s), the limit is 86400 second(s)"
    );
    assert_eq!(
        quota_reason(&r),
        json!({"name": "max_lease_duration", "limit": 86_400, "in_use": 0,
               "requested": 86_460})
    );
    let r = app
        .post(
            "/v1/leases",
            lease("far", "2030-01-07 08:01", "2030-01-07 10:00", json!([])),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(quota_reason(&r)["name"], "max_start_ahead");
    assert_eq!(quota_reason(&r)["requested"], 7 * 86_400 + 60);
    let r = app
        .post(
            "/v1/leases",
            lease("near", "2030-01-07 08:00", "2030-01-07 10:00", json!([])),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // An override lifts a default for one project only.
    app.act_as_admin();
    app.put("/v1/quotas/alpha", json!({"max_lease_duration": -1}))
        .await;
    app.act_as("alpha", "u1", "member");
    let r = app
        .post(
            "/v1/leases",
            lease("long", "2030-01-01 10:00", "2030-01-03 10:00", json!([])),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as("beta", "u2", "member");
    let r = app
        .post(
            "/v1/leases",
            lease("long", "2030-01-01 10:00", "2030-01-03 10:00", json!([])),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
}

#[tokio::test]
async fn monthly_budget_counts_weighted_host_hours_per_calendar_month() {
    let mut app = TestApp::builder()
        .configure(|cli| {
            cli.quota_host_hours_per_month = Some(100);
            cli.quota_host_weights = vec!["node_type=gpu:2".into()];
        })
        .spawn()
        .await;
    app.create_host("gpu-1", json!({"node_type": "gpu"})).await;
    app.create_host("cpu-1", json!({"node_type": "compute"}))
        .await;
    let gpu = r#"["=", "$node_type", "gpu"]"#;
    let cpu = r#"["=", "$node_type", "compute"]"#;
    app.act_as("alpha", "u1", "member");
    // 36 hours on the GPU node across the month's end: 24 h (48 weighted) in January,
    // 12 h (24 weighted) in February.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "gpu",
                "2030-01-31 00:00",
                "2030-02-01 12:00",
                json!([hosts(1, gpu)]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // January: 48 + 54 = 102 > 100.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "jan",
                "2030-01-10 00:00",
                "2030-01-12 06:00",
                json!([hosts(1, cpu)]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        r.message(),
        "Quota host_hours_per_month of project alpha exceeded in 2030-01: 48 host-hour(s) in \
         use and 54 requested, the limit is 100"
    );
    assert_eq!(
        quota_reason(&r),
        json!({"name": "host_hours_per_month", "limit": 100, "in_use": 48,
               "requested": 54, "month": "2030-01"})
    );
    // 52 hours fit exactly.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "jan",
                "2030-01-10 00:00",
                "2030-01-12 04:00",
                json!([hosts(1, cpu)]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // February starts with 24 weighted hours used: 76 more fit, 77 do not.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "feb",
                "2030-02-02 00:00",
                "2030-02-05 05:00",
                json!([hosts(1, cpu)]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        quota_reason(&r),
        json!({"name": "host_hours_per_month", "limit": 100, "in_use": 24,
               "requested": 77, "month": "2030-02"})
    );
    let r = app
        .post(
            "/v1/leases",
            lease(
                "feb",
                "2030-02-02 00:00",
                "2030-02-05 04:00",
                json!([hosts(1, cpu)]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // The usage shown is the month the clock is in (nothing yet in December).
    let r = app.get("/v1/quotas/alpha").await;
    assert_eq!(r.body["quota"]["usage"]["month"], "2029-12");
    assert_eq!(r.body["quota"]["usage"]["host_hours"], 0);
}

#[tokio::test]
async fn updates_are_refused_with_400_only_for_what_they_make_worse() {
    let mut app = app_with_hosts(2, |_| {}).await;
    app.put("/v1/quotas/alpha", json!({"hosts": 1})).await;
    app.act_as("alpha", "u1", "member");
    let a = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    let a = id_of(&a);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "b",
                "2030-01-01 12:00",
                "2030-01-01 14:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // Extending a into b's window: two hosts at once.
    let extend = json!({"end_date": "2030-01-01 13:00"});
    for path in [
        format!("/v1/leases/{a}?dry_run=true"),
        format!("/v1/leases/{a}"),
    ] {
        let r = app.put(&path, extend.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert_eq!(
            quota_reason(&r),
            json!({"name": "hosts", "limit": 1, "in_use": 1, "requested": 1,
                   "at": "2030-01-01T12:00:00.000000"})
        );
    }
    let r = app.get(&format!("/v1/leases/{a}")).await;
    assert_eq!(r.body["lease"]["end_date"], "2030-01-01T12:00:00.000000");

    // An amount change is measured the same way.
    let r = app.get(&format!("/v1/leases/{a}")).await;
    let rid = r.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = app
        .put(
            &format!("/v1/leases/{a}"),
            json!({"reservations": [{"id": rid, "min": 2, "max": 2}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(quota_reason(&r)["requested"], 2);

    // Lowered below what the project holds: shrinking is still allowed, growing is not.
    app.act_as_admin();
    app.put(
        "/v1/quotas/alpha",
        json!({"hosts": 0, "max_lease_duration": 3600}),
    )
    .await;
    app.act_as("alpha", "u1", "member");
    let r = app
        .put(
            &format!("/v1/leases/{a}"),
            json!({"end_date": "2030-01-01 11:30"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app
        .put(
            &format!("/v1/leases/{a}"),
            json!({"end_date": "2030-01-01 11:45"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    // Longer than before, so the duration is refused; and a host past the limit of none for
    // the quarter hour it did not cover before.
    let reasons: Vec<Value> = r.body["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["quota"].clone())
        .collect();
    assert_eq!(
        reasons,
        [
            json!({"name": "max_lease_duration", "limit": 3600, "in_use": 0,
                   "requested": 6300}),
            json!({"name": "hosts", "limit": 0, "in_use": 0, "requested": 1,
                   "at": "2030-01-01T11:30:00.000000"}),
        ],
        "{}",
        r.body
    );
    // A rename is never measured.
    let r = app
        .put(&format!("/v1/leases/{a}"), json!({"name": "renamed"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// A project over a limit lowered since keeps what its leases hold, at each instant: it may
/// shorten them, but not extend them or move them to times they did not cover, even where
/// its peak stays the same.
#[tokio::test]
async fn a_lease_over_a_lowered_limit_may_not_be_made_longer_or_moved() {
    let mut app = app_with_hosts(2, |_| {}).await;
    app.put("/v1/quotas/alpha", json!({"hosts": 2})).await;
    app.act_as("alpha", "u1", "member");
    let a = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2030-02-01 10:00",
                "2030-02-01 12:00",
                json!([hosts(2, "")]),
            ),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let a = id_of(&a);
    app.act_as_admin();
    app.put("/v1/quotas/alpha", json!({"hosts": 1})).await;
    app.act_as("alpha", "u1", "member");
    for change in [
        json!({"end_date": "2030-03-01 12:00"}),
        json!({"start_date": "2030-01-20 10:00"}),
        json!({"start_date": "2030-02-01 11:00", "end_date": "2030-02-01 13:00"}),
    ] {
        let r = app.put(&format!("/v1/leases/{a}"), change.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{change}: {}", r.body);
        let reason = quota_reason(&r);
        assert_eq!(
            (&reason["name"], &reason["limit"], &reason["requested"]),
            (&json!("hosts"), &json!(1), &json!(2)),
            "{change}: {}",
            r.body
        );
    }
    let r = app.get(&format!("/v1/leases/{a}")).await;
    assert_eq!(r.body["lease"]["start_date"], "2030-02-01T10:00:00.000000");
    assert_eq!(r.body["lease"]["end_date"], "2030-02-01T12:00:00.000000");
    let r = app
        .put(
            &format!("/v1/leases/{a}"),
            json!({"start_date": "2030-02-01 10:30", "end_date": "2030-02-01 11:30"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// Fifty concurrent creates of one host each, in the same window, for a project allowed
/// five: exactly five are created, the others refused for the quota, and never more than
/// five hosts are held, whichever backend runs them (SQLite batches them in one
/// transaction; PostgreSQL runs them side by side under the allocation lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_creates_never_take_a_project_past_its_host_quota() {
    let mut app = app_with_hosts(60, |cli| cli.quota_hosts = Some(5)).await;
    app.act_as("alpha", "u1", "member");
    let requests = (0..50).map(|i| {
        app.post(
            "/v1/leases",
            lease(
                &format!("race-{i}"),
                "2030-01-01 10:00",
                // Windows of different lengths, all holding 10:00-11:00.
                &format!("2030-01-01 {}:00", 11 + i % 5),
                json!([hosts(1, "")]),
            ),
        )
    });
    let responses = join_all(requests).await;
    let created = responses
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    assert_eq!(
        created,
        5,
        "{:?}",
        responses
            .iter()
            .map(|r| (r.status, r.message()))
            .collect::<Vec<_>>()
    );
    for r in responses.iter().filter(|r| r.status != StatusCode::CREATED) {
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        let q = quota_reason(r);
        assert_eq!(q["name"], "hosts");
        assert_eq!(q["in_use"], 5);
    }
    let leases = app.get("/v1/leases").await.body["leases"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(leases, 5);
}

/// Offers keep to the quotas a window alone decides: a request whose shortest lease is too
/// long is refused as its create would be; a range stops at the longest allowed, and no
/// offer starts further ahead than allowed.
#[tokio::test]
async fn offers_keep_to_the_lease_duration_and_start_ahead_quotas() {
    let mut app = app_with_hosts(1, |cli| {
        cli.quota_max_lease_duration = Some(86_400);
        cli.quota_max_start_ahead = Some(2 * 86_400);
    })
    .await;
    app.act_as("alpha", "ada", "member");
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": [hosts(1, "")], "duration": 2880}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(quota_reason(&r)["name"], "max_lease_duration");
    // The host is busy for most of the next day: a lease of a day starts after that, and
    // later ones would start too far ahead.
    app.act_as_admin();
    let now = app.service.now();
    let busy_until = now + chrono::Duration::hours(23);
    let fmt = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M").to_string();
    let r = app
        .post(
            "/v1/leases",
            lease(
                "busy",
                &fmt(now + chrono::Duration::hours(1)),
                &fmt(busy_until),
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as("alpha", "ada", "member");
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": [hosts(1, "")], "min_duration": 60,
                   "max_duration": 2880, "order": "longest", "limit": 5}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let offers = r.body["offers"].as_array().unwrap().clone();
    assert!(!offers.is_empty(), "{}", r.body);
    let parse = |v: &Value| {
        chrono::NaiveDateTime::parse_from_str(v.as_str().unwrap(), "%Y-%m-%dT%H:%M:%S%.f")
            .unwrap()
            .and_utc()
    };
    for offer in &offers {
        let (start, end) = (parse(&offer["start_date"]), parse(&offer["end_date"]));
        assert!(end - start <= chrono::Duration::days(1), "{offer}");
        assert!(start - now <= chrono::Duration::days(2), "{offer}");
        // Each is bookable as offered.
        let r = app
            .post(
                "/v1/leases?dry_run=true",
                lease("o", &fmt(start), &fmt(end), json!([hosts(1, "")])),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{offer}: {}", r.body);
    }
}

/// The next offer of a refused create is a window the project may book: none for a lease
/// longer than it may hold whatever its start, none that starts further ahead than it may
/// book, and one it books with a 201 otherwise.
#[tokio::test]
async fn a_refusals_next_offer_keeps_to_the_lease_duration_and_start_ahead_quotas() {
    let mut app = app_with_hosts(1, |_| {}).await;
    let r = app
        .put(
            "/v1/quotas/alpha",
            json!({"max_lease_duration": 2 * 3600, "max_start_ahead": 2 * 86_400}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let now = app.service.now();
    let at = |hours: i64| {
        (now + chrono::Duration::hours(hours))
            .format("%Y-%m-%d %H:%M")
            .to_string()
    };
    app.act_as_admin();
    let r = app
        .post(
            "/v1/leases",
            lease("busy", &at(1), &at(23), json!([hosts(1, "")])),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as("alpha", "ada", "member");
    let next_offer = |r: &crate::harness::Response| {
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
        r.body["reasons"][0]["next_offer"].clone()
    };

    // Three hours: refused for the busy host first (as Blazar looks for the resources
    // before it asks its filters), and no window of three hours would be granted.
    let r = app
        .post(
            "/v1/leases",
            lease("long", &at(2), &at(5), json!([hosts(1, "")])),
        )
        .await;
    assert_eq!(next_offer(&r), Value::Null, "{}", r.body);

    // One hour: the host is free from 23 hours on, which the project may book.
    let r = app
        .post(
            "/v1/leases",
            lease("short", &at(2), &at(3), json!([hosts(1, "")])),
        )
        .await;
    let next = next_offer(&r);
    assert_eq!(
        next["start_date"],
        format!("{}:00.000000", at(23).replace(' ', "T")),
        "{}",
        r.body
    );

    // Busy on to three days from now: the next free hour starts further ahead than the
    // project may book.
    app.act_as_admin();
    let r = app
        .post(
            "/v1/leases",
            lease("busy2", &at(23), &at(72), json!([hosts(1, "")])),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as("alpha", "ada", "member");
    let r = app
        .post(
            "/v1/leases",
            lease("short", &at(2), &at(3), json!([hosts(1, "")])),
        )
        .await;
    assert_eq!(next_offer(&r), Value::Null, "{}", r.body);
}

/// An admin's refused update of a member's lease is advised as the member would be: the
/// lease's project's quotas bound the next offer, not the admin's own project's.
#[tokio::test]
async fn a_refused_update_is_advised_by_the_leases_own_quotas() {
    let mut app = app_with_hosts(1, |_| {}).await;
    app.put(
        "/v1/quotas/alpha",
        json!({"max_lease_duration": 2 * 3600, "max_start_ahead": 2 * 86_400}),
    )
    .await
    .assert_status(StatusCode::OK);
    let now = app.service.now();
    let at = |hours: i64| {
        (now + chrono::Duration::hours(hours))
            .format("%Y-%m-%d %H:%M")
            .to_string()
    };
    app.act_as("alpha", "ada", "member");
    let r = app
        .post(
            "/v1/leases",
            lease("mine", &at(30), &at(31), json!([hosts(1, "")])),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let mine = id_of(&r);
    // The host is busy around it until three days from now.
    app.act_as_admin();
    for (name, from, to) in [("a", 1, 30), ("b", 31, 72)] {
        let r = app
            .post(
                "/v1/leases",
                lease(name, &at(from), &at(to), json!([hosts(1, "")])),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    // Two hours from now on: busy. The next two free hours start three days ahead, further
    // than alpha may book, so there is no offer, though the admin's project has no limit.
    let r = app
        .put(
            &format!("/v1/leases/{mine}"),
            json!({"start_date": at(2), "end_date": at(4)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(
        r.body["reasons"][0]["next_offer"],
        Value::Null,
        "{}",
        r.body
    );
}

/// The longest windows of a range all start too far ahead: the bookable shorter ones are
/// offered rather than none.
#[tokio::test]
async fn offers_that_start_too_far_ahead_do_not_crowd_out_bookable_ones() {
    let mut app = app_with_hosts(1, |cli| {
        cli.quota_max_lease_duration = Some(86_400);
        cli.quota_max_start_ahead = Some(2 * 86_400);
    })
    .await;
    let now = app.service.now();
    let fmt = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M").to_string();
    let hours = |h: i64| now + chrono::Duration::hours(h);
    // Busy from the second hour to the fiftieth: free for an hour now, then only after the
    // two days the project may book ahead.
    for (i, (from, to)) in [(1, 24), (24, 47), (47, 50)].into_iter().enumerate() {
        let r = app
            .post(
                "/v1/leases",
                lease(
                    &format!("busy{i}"),
                    &fmt(hours(from)),
                    &fmt(hours(to)),
                    json!([hosts(1, "")]),
                ),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    app.act_as("alpha", "ada", "member");
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": [hosts(1, "")], "min_duration": 30,
                   "max_duration": 1440, "order": "longest", "limit": 1}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let offers = r.body["offers"].as_array().unwrap();
    assert_eq!(offers.len(), 1, "{}", r.body);
    assert_eq!(
        offers[0]["end_date"].as_str().unwrap()[..16],
        fmt(hours(1)).replace(' ', "T")
    );
}

/// Offers and `earliest` creates keep within the project's quotas as a create of the same
/// window would: windows where the project would hold more hosts at once than it may, or
/// go past its monthly budget, are not offered, and the earliest create books the first
/// window that a plain create of it would not refuse.
#[tokio::test]
async fn offers_and_earliest_creates_keep_within_the_project_quotas() {
    let mut app = app_with_hosts(4, |cli| {
        cli.quota_hosts = Some(2);
        cli.quota_host_hours_per_month = Some(20);
    })
    .await;
    // Another project's lease counts toward nothing of alpha's.
    app.act_as("beta", "u2", "member");
    let r = app
        .post(
            "/v1/leases",
            lease(
                "b",
                "2029-12-31 08:30",
                "2029-12-31 20:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as("alpha", "u1", "member");
    let r = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2029-12-31 09:00",
                "2029-12-31 12:00",
                json!([hosts(2, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    let offers = |duration: i64, limit: i64| json!({"reservations": [hosts(1, "")], "duration": duration, "limit": limit});
    let starts = |r: &crate::harness::Response| -> Vec<String> {
        r.body["offers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["start_date"].as_str().unwrap()[..16].to_string())
            .collect()
    };
    // Two hosts are free from 08:00, but alpha holds two from 09:00 to 12:00.
    let r = app.post("/v1/leases/offers", offers(120, 2)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(starts(&r), ["2029-12-31T12:00", "2029-12-31T14:00"]);
    // Booked as offered, with a plain create.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "c",
                "2029-12-31 12:00",
                "2029-12-31 14:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // Two at once are allowed: the first earliest create goes beside it, the next after.
    for expected in ["2029-12-31T12:00", "2029-12-31T14:00"] {
        let r = app
            .post(
                "/v1/leases",
                json!({"name": "e", "start_date": "earliest", "duration": 120,
                       "reservations": [hosts(1, "")]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        assert_eq!(
            &r.body["lease"]["start_date"].as_str().unwrap()[..16],
            expected
        );
    }
    // 6 + 2 + 2 + 2 = 12 of December's 20 host-hours are booked: a 9-hour lease is offered
    // where at most 8 of its hours fall in December and it is the only host held: 16:00.
    let r = app.post("/v1/leases/offers", offers(540, 1)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(starts(&r), ["2029-12-31T16:00"]);
    assert_eq!(
        r.body["offers"][0]["end_date"],
        "2030-01-01T01:00:00.000000"
    );
    let r = app
        .post(
            "/v1/leases",
            lease(
                "j",
                "2029-12-31 16:00",
                "2030-01-01 01:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // With January's first hour booked, a range of durations gets the longest the budget
    // leaves: 19 hours, whichever minute that ends at.
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": [hosts(1, "")], "min_duration": 60,
                   "max_duration": 1440, "not_before": "2030-01-01 02:00", "limit": 1}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(starts(&r), ["2030-01-01T02:00"]);
    assert_eq!(
        r.body["offers"][0]["end_date"],
        "2030-01-01T21:00:00.000000"
    );
    let r = app
        .post(
            "/v1/leases",
            lease(
                "k",
                "2030-01-01 02:00",
                "2030-01-01 21:01",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "k",
                "2030-01-01 02:00",
                "2030-01-01 21:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

/// Instance slots and floating IPs held at once are kept within their quotas by offers too.
#[tokio::test]
async fn offers_keep_within_instance_and_floating_ip_quotas() {
    let app = app_with_instance_and_address_quotas().await;
    let address = address();
    for (name, reservations) in [("i", instances(2)), ("f", address.clone())] {
        let r = app
            .post(
                "/v1/leases",
                lease(name, "2030-01-01 10:00", "2030-01-01 12:00", reservations),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    for (reservations, expected) in [
        (instances(1), "2030-01-01T10:00"),
        (instances(2), "2030-01-01T12:00"),
        (address, "2030-01-01T12:00"),
    ] {
        let r = app
            .post(
                "/v1/leases/offers",
                json!({"reservations": reservations, "duration": 60,
                       "not_before": "2030-01-01 10:00", "limit": 2}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let first = r.body["offers"][0]["start_date"].as_str().unwrap();
        assert_eq!(&first[..16], expected, "{reservations}: {}", r.body);
    }
}

/// A lease that goes over a concurrent quota on its own fits no window: offers and
/// `earliest` creates answer the 403 a create of any window gets, not "no window".
#[tokio::test]
async fn searches_for_a_lease_over_a_quota_on_its_own_answer_the_quota() {
    let app = app_with_instance_and_address_quotas().await;
    let two_addresses =
        json!([{"resource_type": "virtual:floatingip", "network_id": "net-1", "amount": 2}]);
    for (reservations, quota) in [(instances(4), "instances"), (two_addresses, "floatingips")] {
        let dated = app
            .post(
                "/v1/leases",
                lease(
                    "d",
                    "2030-01-01 10:00",
                    "2030-01-01 11:00",
                    reservations.clone(),
                ),
            )
            .await;
        assert_eq!(dated.status, StatusCode::FORBIDDEN, "{}", dated.body);
        for (path, body) in [
            (
                "/v1/leases/offers",
                json!({"reservations": reservations, "duration": 60,
                       "not_before": "2030-01-01 10:00"}),
            ),
            (
                "/v1/leases",
                json!({"name": "e", "start_date": "earliest", "duration": 60,
                       "reservations": reservations}),
            ),
        ] {
            let r = app.post(path, body).await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {}", r.body);
            assert_eq!(r.body["error_code"], 403, "{}", r.body);
            let reason = quota_reason(&r);
            assert_eq!(reason["name"], quota, "{}", r.body);
            assert_eq!(reason["in_use"], 0, "{}", r.body);
            assert!(
                r.message()
                    .contains(&format!("Quota {quota} of project alpha exceeded"))
                    && r.message().contains("the lease alone would hold"),
                "{}",
                r.message()
            );
        }
    }
    // Within the quota, the same searches answer a window.
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": instances(3), "duration": 60,
                   "not_before": "2030-01-01 10:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        !r.body["offers"].as_array().unwrap().is_empty(),
        "{}",
        r.body
    );
    assert_eq!(app.get("/v1/leases").await.body["leases"], json!([]));
}

/// An extension check's latest end is one the update would allow: the lease length quota
/// and the monthly budget stop it before the resources would.
#[tokio::test]
async fn the_latest_end_of_an_extension_keeps_within_the_quotas() {
    let mut app = app_with_hosts(1, |cli| {
        cli.quota_host_hours_per_month = Some(10);
        cli.quota_max_lease_duration = Some(8 * 3600);
    })
    .await;
    app.act_as("beta", "u2", "member");
    let r = app
        .post(
            "/v1/leases",
            lease(
                "b",
                "2030-01-10 22:00",
                "2030-01-10 23:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as("alpha", "u1", "member");
    let r = app
        .post(
            "/v1/leases",
            lease(
                "l",
                "2030-01-10 10:00",
                "2030-01-10 14:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = id_of(&r);
    async fn latest(app: &TestApp, id: &str) -> Value {
        let r = app
            .get(&format!("/v1/leases/{id}/extension?prolong_for=7h"))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.body["extension"]["possible"], false, "{}", r.body);
        r.body["extension"]["latest_end_date"].clone()
    }
    // The host is free until 22:00, the budget until 20:00, the length limit until 18:00.
    assert_eq!(latest(&app, &id).await, "2030-01-10T18:00:00.000000");
    app.act_as_admin();
    app.put("/v1/quotas/alpha", json!({"max_lease_duration": -1}))
        .await;
    app.act_as("alpha", "u1", "member");
    assert_eq!(latest(&app, &id).await, "2030-01-10T20:00:00.000000");
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-10 20:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // Nothing more to reach: no latest end beyond the lease's own.
    assert_eq!(latest(&app, &id).await, Value::Null);
}

/// A ranged host request ("between min and max") under a host quota is granted as many as
/// the quota leaves, not refused for asking up to max; offers name the same hosts, and
/// below its minimum it is refused as before.
#[tokio::test]
async fn a_ranged_host_request_gets_what_the_host_quota_leaves() {
    let mut app = app_with_hosts(5, |cli| cli.quota_hosts = Some(3)).await;
    app.act_as("alpha", "ada", "member");
    let r = app
        .post(
            "/v1/leases",
            lease(
                "one",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([hosts(1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    // Alpha holds one host from 10:00: an overlapping ranged request gets two of the four
    // free, as its offer says.
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": ranged(1, 4), "duration": 60,
                   "not_before": "2030-01-01 11:00", "not_after": "2030-01-01 13:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let offer = r.body["offers"][0].clone();
    assert_eq!(offer["start_date"], "2030-01-01T11:00:00.000000", "{offer}");
    assert_eq!(offer["reservations"][0]["amount"], 2, "{offer}");
    let offered: Vec<String> = offer["reservations"][0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap().to_string())
        .collect();
    let r = app
        .post(
            "/v1/leases",
            lease("two", "2030-01-01 11:00", "2030-01-01 12:00", ranged(1, 4)),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let two = id_of(&r);
    // Its request is kept as asked.
    let reservation = &r.body["lease"]["reservations"][0];
    assert_eq!(reservation["max"], 4, "{reservation}");
    app.act_as_admin();
    assert_eq!(app.hosts_of(&two).await, offered);
    app.act_as("alpha", "ada", "member");

    // The quota is full from 11:00 to 12:00: a further ranged request there is refused.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "three",
                "2030-01-01 11:30",
                "2030-01-01 12:30",
                ranged(1, 2),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(quota_reason(&r)["name"], "hosts");
    // Two ranged requests in one lease: the first leaves the second its minimum.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "four",
                "2030-01-02 10:00",
                "2030-01-02 12:00",
                json!([ranged(1, 5)[0], ranged(2, 2)[0]]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as_admin();
    assert_eq!(app.hosts_of(&id_of(&r)).await.len(), 3);
}

#[tokio::test]
async fn a_ranged_host_request_gets_what_the_monthly_budget_leaves() {
    let mut app = app_with_hosts(5, |cli| cli.quota_host_hours_per_month = Some(100)).await;
    app.act_as("alpha", "ada", "member");
    // A day of five hosts is 120 host-hours; 100 a month leave room for four, as the
    // offer for it says.
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": ranged(1, 5), "duration": 1440,
                   "not_before": "2030-01-10 00:00", "not_after": "2030-01-12 00:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let offer = r.body["offers"][0].clone();
    assert_eq!(offer["start_date"], "2030-01-10T00:00:00.000000", "{offer}");
    assert_eq!(offer["reservations"][0]["amount"], 4, "{offer}");
    let r = app
        .post(
            "/v1/leases",
            lease("day", "2030-01-10 00:00", "2030-01-11 00:00", ranged(1, 5)),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let day = id_of(&r);
    assert_eq!(r.body["lease"]["reservations"][0]["max"], 5);
    app.act_as_admin();
    assert_eq!(app.hosts_of(&day).await.len(), 4);
    app.act_as("alpha", "ada", "member");

    // Four hours are left in January: five hours of even one host are refused, with the
    // minimum as what was requested; two hours of up to three hosts get two.
    let r = app
        .post(
            "/v1/leases",
            lease("more", "2030-01-20 00:00", "2030-01-20 05:00", ranged(1, 3)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        quota_reason(&r),
        json!({"name": "host_hours_per_month", "limit": 100, "in_use": 96,
               "requested": 5, "month": "2030-01"})
    );
    let r = app
        .post(
            "/v1/leases",
            lease(
                "short",
                "2030-01-20 00:00",
                "2030-01-20 02:00",
                ranged(1, 3),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let short = id_of(&r);
    app.act_as_admin();
    assert_eq!(app.hosts_of(&short).await.len(), 2);
}

#[tokio::test]
async fn a_ranged_host_request_under_a_weighted_budget_counts_the_heaviest_host() {
    let mut app = TestApp::builder()
        .configure(|cli| {
            cli.quota_host_hours_per_month = Some(100);
            cli.quota_host_weights = vec!["node_type=gpu:2".into()];
        })
        .spawn()
        .await;
    app.create_host("gpu-1", json!({"node_type": "gpu"})).await;
    for i in 0..3 {
        app.create_host(&format!("cpu-{i}"), json!({"node_type": "compute"}))
            .await;
    }
    app.act_as("alpha", "u1", "member");
    // 21 hours: all four hosts (105) do not fit, three compute hosts (63) would, but any
    // host may be the GPU node (42): two are asked for, which fit whichever they are.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "mixed",
                "2030-03-02 00:00",
                "2030-03-02 21:00",
                ranged(1, 4),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let mixed = id_of(&r);
    app.act_as_admin();
    assert_eq!(app.hosts_of(&mixed).await.len(), 2);
}

#[tokio::test]
async fn an_update_of_a_ranged_host_request_keeps_within_what_the_quotas_leave() {
    let mut app = app_with_hosts(5, |cli| {
        cli.quota_hosts = Some(3);
        cli.quota_host_hours_per_month = Some(100);
    })
    .await;
    app.act_as("alpha", "ada", "member");
    // Three hosts (the hosts quota) for ten hours: 30 host-hours.
    let r = app
        .post(
            "/v1/leases",
            lease("grow", "2030-01-10 00:00", "2030-01-10 10:00", ranged(1, 5)),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = id_of(&r);
    app.act_as_admin();
    let held = app.hosts_of(&id).await;
    assert_eq!(held.len(), 3);
    app.act_as("alpha", "ada", "member");
    // Five more hours: still three hosts, the same ones, not five refused by the quota.
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-10 15:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    app.act_as_admin();
    assert_eq!(app.hosts_of(&id).await, held);
    app.act_as("alpha", "ada", "member");
    // 45 host-hours now; to 30 hours long, three hosts would be 90 of the 100: fine; to 40
    // hours, three are 120, two are 80: it keeps its hosts and is refused by the budget
    // rather than losing one.
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-11 06:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-11 16:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(
        quota_reason(&r)["name"],
        "host_hours_per_month",
        "{}",
        r.body
    );
    app.act_as_admin();
    assert_eq!(app.hosts_of(&id).await, held);
}
