//! `/v1/leases`: create, show, list, update, delete, and physical:host allocation rules.

use blazar_service::Settings;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::TestApp;

const GPU: &str = r#"["==", "$gpu", "true"]"#;

async fn three_hosts(app: &TestApp) {
    app.create_host(
        "compute-1",
        json!({"vcpus": 8, "memory_mb": 16384, "gpu": "false", "cores": "9"}),
    )
    .await;
    app.create_host(
        "compute-2",
        json!({"vcpus": 16, "memory_mb": 65536, "gpu": "true", "cores": "10"}),
    )
    .await;
    app.create_host(
        "compute-3",
        json!({"vcpus": 32, "memory_mb": 131072, "gpu": "false", "cores": "100"}),
    )
    .await;
}

fn id(r: &crate::harness::Response) -> String {
    r.body["lease"]["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn create_lease_has_blazar_shape() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let r = app
        .post(
            "/v1/leases",
            json!({
                "name": "lease-1", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
                "before_end_date": null, "events": [],
                "reservations": [{"resource_type": "physical:host", "min": 1, "max": 2,
                    "hypervisor_properties": "[\">=\", \"$memory_mb\", \"32768\"]", "resource_properties": GPU}],
            }),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease = &r.body["lease"];
    assert_eq!(lease["name"], "lease-1");
    assert_eq!(lease["status"], "PENDING");
    assert_eq!(lease["degraded"], false);
    assert_eq!(lease["start_date"], "2030-01-01T10:00:00.000000");
    assert_eq!(lease["end_date"], "2030-01-01T12:00:00.000000");
    assert_eq!(lease["project_id"], "admin-project");
    assert_eq!(lease["user_id"], "admin-user");
    assert_eq!(lease["created_at"], "2029-12-31 08:00:00");
    let res = &lease["reservations"][0];
    // Clients print nested objects in the order received: Blazar's order.
    let keys: Vec<&str> = res
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "id",
            "lease_id",
            "resource_id",
            "resource_type",
            "status",
            "missing_resources",
            "resources_changed",
            "created_at",
            "updated_at",
            "hypervisor_properties",
            "resource_properties",
            "before_end",
            "min",
            "max",
        ]
    );
    let event_keys: Vec<&str> = lease["events"][0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        event_keys,
        [
            "id",
            "lease_id",
            "event_type",
            "time",
            "status",
            "created_at",
            "updated_at"
        ]
    );
    assert_eq!(res["resource_type"], "physical:host");
    assert_eq!(res["status"], "pending");
    assert_eq!(res["min"], 1);
    assert_eq!(res["max"], 2);
    assert_eq!(res["before_end"], "default");
    assert_eq!(res["resource_properties"], GPU);
    assert_eq!(
        res["hypervisor_properties"],
        "[\">=\", \"$memory_mb\", \"32768\"]"
    );
    assert_eq!(res["missing_resources"], false);
    assert_eq!(res["resources_changed"], false);
    assert_eq!(res["lease_id"], lease["id"]);
    let mut events: Vec<(String, String, String)> = lease["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event_type"].as_str().unwrap().to_string(),
                e["time"].as_str().unwrap().to_string(),
                e["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    events.sort();
    assert_eq!(
        events,
        vec![
            (
                "before_end_lease".into(),
                "2030-01-01T11:00:00.000000".into(),
                "UNDONE".into()
            ),
            (
                "end_lease".into(),
                "2030-01-01T12:00:00.000000".into(),
                "UNDONE".into()
            ),
            (
                "start_lease".into(),
                "2030-01-01T10:00:00.000000".into(),
                "UNDONE".into()
            ),
        ]
    );
    // Only compute-2 has a GPU and enough memory.
    assert_eq!(app.hosts_of(&id(&r)).await, vec!["2".to_string()]);
    let shown = app.get(&format!("/v1/leases/{}", id(&r))).await;
    assert_eq!(shown.body["lease"], *lease);
}

#[tokio::test]
async fn lease_creation_errors_are_4xx_and_write_nothing() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let host = |min: Value, max: Value, props: &str| {
        json!([{"resource_type": "physical:host", "min": min, "max": max,
                "hypervisor_properties": "", "resource_properties": props}])
    };
    let lease = |start: &str, end: &str, reservations: Value| json!({"name": "l", "start_date": start, "end_date": end, "reservations": reservations, "events": []});
    let good = host(json!(1), json!(1), "");
    let long_name = "n".repeat(81);
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            json!({"start_date": "2030-01-01 10:00"}),
            StatusCode::BAD_REQUEST,
            "Missing parameter name, end_date",
        ),
        (
            lease("2030-01-01 10:00:00", "2030-01-01 12:00", good.clone()),
            StatusCode::BAD_REQUEST,
            "is an invalid date",
        ),
        (
            lease("tomorrow", "2030-01-01 12:00", good.clone()),
            StatusCode::BAD_REQUEST,
            "tomorrow is an invalid date. Required format: %Y-%m-%d %H:%M",
        ),
        (
            lease("2030-01-01 10:00", "+262142-12-31 23:59", good.clone()),
            StatusCode::BAD_REQUEST,
            "+262142-12-31 23:59 is an invalid date. Required format: %Y-%m-%d %H:%M",
        ),
        (
            lease("2030-01-01 10:00", "10000-01-01 00:00", good.clone()),
            StatusCode::BAD_REQUEST,
            "10000-01-01 00:00 is an invalid date",
        ),
        (
            lease("2020-01-01 10:00", "2030-01-01 12:00", good.clone()),
            StatusCode::BAD_REQUEST,
            "Start date must be later than current date",
        ),
        (
            lease("2030-01-01 12:00", "2030-01-01 10:00", good.clone()),
            StatusCode::BAD_REQUEST,
            "End date must be later than start date",
        ),
        (
            lease("2030-01-01 10:00", "2030-01-01 10:00", good.clone()),
            StatusCode::BAD_REQUEST,
            "End date must be later than start date",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([{"resource_type": "virtual:nothing"}]),
            ),
            StatusCode::BAD_REQUEST,
            "The virtual:nothing resource type is not supported",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([{"min": 1, "max": 1}]),
            ),
            StatusCode::BAD_REQUEST,
            "Missing parameter resource_type",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                host(json!("1.5"), json!("2"), ""),
            ),
            StatusCode::BAD_REQUEST,
            "Malformed parameter min",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                host(json!("1"), json!("two"), ""),
            ),
            StatusCode::BAD_REQUEST,
            "Malformed parameter max",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                host(json!(""), json!(""), ""),
            ),
            StatusCode::BAD_REQUEST,
            "Malformed parameter min",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                host(json!(2), json!(1), ""),
            ),
            StatusCode::BAD_REQUEST,
            "Max must be equal to or larger than min",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                host(json!(1), json!(1), "[\"==\", \"$gpu\"]"),
            ),
            StatusCode::BAD_REQUEST,
            "Malformed requirements",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                host(json!(1), json!(1), "[\"==\", \"$colour\", \"red\"]"),
            ),
            StatusCode::BAD_REQUEST,
            "Unknown property $colour",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                host(json!(5), json!(5), ""),
            ),
            StatusCode::CONFLICT,
            "3 host(s) match the filters and are reservable, 3 of them free",
        ),
        (
            lease(
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                host(json!(2), json!(2), GPU),
            ),
            StatusCode::CONFLICT,
            "1 host(s) match",
        ),
        (
            json!({"name": long_name, "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00", "reservations": good.clone()}),
            StatusCode::BAD_REQUEST,
            "the limit is 80",
        ),
        (
            json!({"name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00", "project_id": "other"}),
            StatusCode::BAD_REQUEST,
            "project_id cannot be set",
        ),
        (
            json!({"name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00", "status": "ACTIVE", "id": "x"}),
            StatusCode::BAD_REQUEST,
            "cannot be set",
        ),
        (
            json!({"name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00", "colour": "red"}),
            StatusCode::BAD_REQUEST,
            "Unknown field(s) colour",
        ),
        (
            json!({"name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00", "events": [{"event_type": "start_lease"}]}),
            StatusCode::BAD_REQUEST,
            "Custom lease events are not supported",
        ),
        (
            json!({"name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00", "before_end_date": "2030-01-01 13:00"}),
            StatusCode::BAD_REQUEST,
            "before_end_date 2030-01-01 13:00 must be strictly between",
        ),
        (
            json!({"name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00", "reservations": {"min": 1}}),
            StatusCode::BAD_REQUEST,
            "expected a list",
        ),
        (
            json!({"name": 5, "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00"}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter name",
        ),
    ];
    for (body, status, message) in cases {
        let r = app.post("/v1/leases", body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert_eq!(r.body["error_code"], status.as_u16(), "{body}");
        assert!(r.message().contains(message), "{body}: {}", r.message());
    }
    assert_eq!(app.get("/v1/leases").await.body["leases"], json!([]));
    assert!(
        app.get("/v1/os-hosts/allocations").await.body["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["reservations"] == json!([]))
    );
}

#[tokio::test]
async fn a_lease_with_no_reservations_is_allowed() {
    let app = TestApp::spawn().await;
    let r = app
        .post("/v1/leases", json!({"name": "empty", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["reservations"], json!([]));
}

#[tokio::test]
async fn property_queries_compare_numbers_as_numbers_and_support_or() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let cases: [(&str, Vec<&str>); 6] = [
        (r#"[">", "$cores", "9"]"#, vec!["2", "3"]),
        (r#"["<", "$cores", "10"]"#, vec!["1"]),
        (r#"[">=", "$memory_mb", 65536]"#, vec!["2", "3"]),
        (
            r#"["or", ["==", "$gpu", "true"], [">=", "$vcpus", "32"]]"#,
            vec!["2", "3"],
        ),
        (
            r#"["and", ["==", "$gpu", "false"], ["<=", "$vcpus", "8"]]"#,
            vec!["1"],
        ),
        (
            r#"["!=", "$hypervisor_hostname", "compute-1"]"#,
            vec!["2", "3"],
        ),
    ];
    for (i, (query, expected)) in cases.into_iter().enumerate() {
        // Each lease gets its own day so earlier ones do not interfere.
        let day = 1 + i as u32;
        let r = app
            .host_lease(
                "q",
                &format!("2030-02-{day:02} 10:00"),
                &format!("2030-02-{day:02} 12:00"),
                1,
                3,
                query,
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{query}: {}", r.body);
        assert_eq!(app.hosts_of(&id(&r)).await, expected, "{query}");
    }
}

#[tokio::test]
async fn hosts_are_chosen_greedily_toward_max() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let first = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(app.hosts_of(&id(&first)).await.len(), 1);
    let r = app
        .host_lease("b", "2030-01-01 11:00", "2030-01-01 13:00", 1, 5, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(
        app.hosts_of(&id(&r)).await.len(),
        2,
        "both free hosts, not just min"
    );
}

#[tokio::test]
async fn windows_are_half_open_so_back_to_back_leases_share_a_host() {
    let app = TestApp::spawn().await;
    app.create_host("only", json!({})).await;
    let a = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let b = app
        .host_lease("b", "2030-01-01 12:00", "2030-01-01 14:00", 1, 1, "")
        .await;
    assert_eq!(b.status, StatusCode::CREATED, "{}", b.body);
    let c = app
        .host_lease("c", "2030-01-01 08:00", "2030-01-01 10:00", 1, 1, "")
        .await;
    assert_eq!(c.status, StatusCode::CREATED, "{}", c.body);
    let overlap = app
        .host_lease("d", "2030-01-01 11:59", "2030-01-01 12:01", 1, 1, "")
        .await;
    assert_eq!(overlap.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn cleaning_margin_separates_leases() {
    let app = TestApp::spawn_with(Settings {
        cleaning_minutes: 30,
        ..Settings::default()
    })
    .await;
    app.create_host("only", json!({})).await;
    let a = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let too_soon = app
        .host_lease("b", "2030-01-01 12:00", "2030-01-01 14:00", 1, 1, "")
        .await;
    assert_eq!(too_soon.status, StatusCode::CONFLICT);
    let after_cleaning = app
        .host_lease("b", "2030-01-01 12:30", "2030-01-01 14:00", 1, 1, "")
        .await;
    assert_eq!(
        after_cleaning.status,
        StatusCode::CREATED,
        "{}",
        after_cleaning.body
    );
    let before = app
        .host_lease("c", "2030-01-01 08:00", "2030-01-01 09:45", 1, 1, "")
        .await;
    assert_eq!(
        before.status,
        StatusCode::CONFLICT,
        "cleaning after c would overlap a"
    );
}

#[tokio::test]
async fn list_filters_and_project_isolation() {
    let mut app = TestApp::spawn().await;
    three_hosts(&app).await;
    let admin_lease = app
        .host_lease(
            "admin-lease",
            "2030-01-01 10:00",
            "2030-01-01 12:00",
            1,
            1,
            "",
        )
        .await;
    let admin_id = id(&admin_lease);
    app.act_as("demo", "alice", "member");
    let r = app.get("/v1/leases").await;
    assert_eq!(r.body["leases"], json!([]));
    let mine = app
        .host_lease("mine", "2030-01-02 10:00", "2030-01-02 12:00", 1, 1, "")
        .await;
    assert_eq!(mine.status, StatusCode::CREATED, "{}", mine.body);
    assert_eq!(mine.body["lease"]["project_id"], "demo");
    assert_eq!(mine.body["lease"]["user_id"], "alice");
    let listed = app.get("/v1/leases").await;
    assert_eq!(listed.body["leases"].as_array().unwrap().len(), 1);
    assert_eq!(
        app.get("/v1/leases?project_id=admin-project").await.body["leases"],
        json!([])
    );
    let r = app.get(&format!("/v1/leases/{admin_id}")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.message(),
        "Policy doesn't allow blazar:leases:get to be performed"
    );
    assert_eq!(
        app.put(&format!("/v1/leases/{admin_id}"), json!({"name": "x"}))
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.delete(&format!("/v1/leases/{admin_id}")).await.status,
        StatusCode::FORBIDDEN
    );

    app.act_as("demo", "bob", "reader");
    assert_eq!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let r = app
        .host_lease("nope", "2030-01-03 10:00", "2030-01-03 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        app.delete(&format!("/v1/leases/{}", id(&mine)))
            .await
            .status,
        StatusCode::FORBIDDEN
    );

    app.act_as_admin();
    assert_eq!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        app.get("/v1/leases?project_id=demo").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        app.get("/v1/leases?name=admin-lease").await.body["leases"][0]["id"],
        admin_id.as_str()
    );
    assert_eq!(
        app.get("/v1/leases?status=ACTIVE").await.body["leases"],
        json!([])
    );
    assert_eq!(
        app.get("/v1/leases?status=PENDING").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let bad = app.get("/v1/leases?status=SLEEPING").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.message().contains("Invalid lease status SLEEPING"));
    // An empty value filters nothing (Blazar lists every lease whatever the query).
    assert_eq!(
        app.get("/v1/leases?name=&status=&project_id=&user_id=")
            .await
            .body["leases"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn noauth_identity_tokens_act_as_that_project() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let as_token =
        |token: &'static str, method: reqwest::Method, path: &str, body: Option<Value>| {
            let mut req = app
                .client
                .request(method, format!("{}{}", app.base, path))
                .header("X-Auth-Token", token);
            if let Some(b) = body {
                req = req.json(&b);
            }
            req.send()
        };
    let body = json!({"name": "alice-lease", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00"});
    let r = as_token(
        "peer:alice:demo:member",
        reqwest::Method::POST,
        "/v1/leases",
        Some(body),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let lease: Value = r.json().await.unwrap();
    let project = lease["lease"]["project_id"].as_str().unwrap().to_string();
    assert_eq!(project.len(), 32, "a Keystone-shaped id: {project}");
    let r = as_token(
        "noauth:alice:demo:member",
        reqwest::Method::GET,
        "/v1/os-hosts",
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = as_token(
        "noauth:bob:other:member",
        reqwest::Method::GET,
        "/v1/leases",
        None,
    )
    .await
    .unwrap();
    let listed: Value = r.json().await.unwrap();
    assert_eq!(listed["leases"], json!([]));
    // keystoneauth's "none" plugin sends this token: the default admin.
    let r = as_token("notused", reqwest::Method::GET, "/v1/leases", None)
        .await
        .unwrap();
    let listed: Value = r.json().await.unwrap();
    assert_eq!(listed["leases"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn show_and_delete_missing_lease() {
    let app = TestApp::spawn().await;
    let missing = "00000000-0000-0000-0000-000000000000";
    let r = app.get(&format!("/v1/leases/{missing}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        r.message(),
        format!("Object with {{'lease_id': '{missing}'}} not found")
    );
    assert_eq!(
        app.delete(&format!("/v1/leases/{missing}")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.put(&format!("/v1/leases/{missing}"), json!({"name": "x"}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn update_rename_extend_shrink_move() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let r = app
        .host_lease("lease-1", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, GPU)
        .await;
    let lid = id(&r);
    let path = format!("/v1/leases/{lid}");

    let renamed = app.put(&path, json!({"name": "lease-1-renamed"})).await;
    assert_eq!(renamed.status, StatusCode::OK);
    assert_eq!(renamed.body["lease"]["name"], "lease-1-renamed");
    assert_eq!(
        app.get(&path).await.body["lease"]["name"],
        "lease-1-renamed",
        "the rename is stored"
    );

    let extended = app
        .put(&path, json!({"end_date": "2030-01-01 13:00"}))
        .await;
    assert_eq!(extended.status, StatusCode::OK, "{}", extended.body);
    assert_eq!(
        extended.body["lease"]["end_date"],
        "2030-01-01T13:00:00.000000"
    );
    let times: Vec<(String, String)> = extended.body["lease"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event_type"].as_str().unwrap().into(),
                e["time"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(times.contains(&("end_lease".into(), "2030-01-01T13:00:00.000000".into())));
    assert!(times.contains(&(
        "before_end_lease".into(),
        "2030-01-01T12:00:00.000000".into()
    )));

    let moved = app
        .put(
            &path,
            json!({"start_date": "2030-01-01 10:30", "end_date": "2030-01-01 11:30"}),
        )
        .await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.body);
    assert_eq!(
        moved.body["lease"]["start_date"],
        "2030-01-01T10:30:00.000000"
    );
    assert_eq!(app.hosts_of(&lid).await, vec!["2".to_string()]);

    // Another lease takes the GPU host right after; extending into it fails and changes nothing.
    let other = app
        .host_lease("lease-2", "2030-01-01 12:00", "2030-01-01 14:00", 1, 1, GPU)
        .await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.body);
    let conflict = app
        .put(&path, json!({"end_date": "2030-01-01 13:00"}))
        .await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{}", conflict.body);
    assert!(conflict.message().contains("Not enough hosts available"));
    let after = app.get(&path).await.body;
    assert_eq!(after["lease"]["status"], "PENDING");
    assert_eq!(after["lease"]["end_date"], "2030-01-01T11:30:00.000000");
    assert_eq!(app.hosts_of(&lid).await, vec!["2".to_string()]);
}

#[tokio::test]
async fn update_changes_reservation_min_max_and_properties() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 3, "")
        .await;
    let lid = id(&r);
    let rid = r.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(app.hosts_of(&lid).await.len(), 3);
    let path = format!("/v1/leases/{lid}");
    let shrunk = app
        .put(&path, json!({"reservations": [{"id": rid, "max": 1}]}))
        .await;
    assert_eq!(shrunk.status, StatusCode::OK, "{}", shrunk.body);
    assert_eq!(shrunk.body["lease"]["reservations"][0]["max"], 1);
    assert_eq!(shrunk.body["lease"]["reservations"][0]["min"], 1);
    assert_eq!(app.hosts_of(&lid).await.len(), 1);
    let gpu = app
        .put(
            &path,
            json!({"reservations": [{"id": rid, "resource_properties": GPU}]}),
        )
        .await;
    assert_eq!(gpu.status, StatusCode::OK, "{}", gpu.body);
    assert_eq!(app.hosts_of(&lid).await, vec!["2".to_string()]);

    let cases = [
        (
            json!({"reservations": [{"max": 2}]}),
            StatusCode::BAD_REQUEST,
            "Missing parameter reservation ID",
        ),
        (
            json!({"reservations": [{"id": "nope", "max": 2}, {"id": 7}]}),
            StatusCode::BAD_REQUEST,
            "Please enter valid reservation IDs. Invalid reservation IDs are: nope,7",
        ),
        (
            json!({"reservations": [{"id": rid, "min": 3, "max": 2}]}),
            StatusCode::BAD_REQUEST,
            "Invalid values for min/max of hosts. Max must be equal to or larger than min.",
        ),
        (
            json!({"reservations": [{"id": rid, "min": 0}]}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter min and max (must be greater than or equal to 1)",
        ),
        (
            json!({"reservations": [{"id": rid, "resource_type": "virtual:instance"}]}),
            StatusCode::CONFLICT,
            "resource_type cannot be updated",
        ),
        (
            json!({"reservations": [{"id": rid, "min": 2, "max": 2}]}),
            StatusCode::CONFLICT,
            "Not enough hosts",
        ),
        (
            json!({"start_date": "2020-01-01 10:00"}),
            StatusCode::BAD_REQUEST,
            "Start date must be later than current date",
        ),
        (
            json!({"end_date": "2030-01-01 09:00"}),
            StatusCode::BAD_REQUEST,
            "End date must be later than current and start date",
        ),
        (
            json!({"end_date": "garbage"}),
            StatusCode::BAD_REQUEST,
            "garbage is an invalid date",
        ),
        (
            json!({"end_date": "12030-01-01 09:00"}),
            StatusCode::BAD_REQUEST,
            "12030-01-01 09:00 is an invalid date",
        ),
        (
            json!({"before_end_date": "2030-01-01 09:00"}),
            StatusCode::BAD_REQUEST,
            "must be strictly between",
        ),
        (
            json!({"status": "ACTIVE"}),
            StatusCode::BAD_REQUEST,
            "status cannot be set",
        ),
        (
            json!({"project_id": "x"}),
            StatusCode::BAD_REQUEST,
            "project_id cannot be set",
        ),
    ];
    for (body, status, message) in cases {
        // As in Blazar, the lease is looked for before its fields are read.
        let missing = app.put("/v1/leases/no-such-lease", body.clone()).await;
        assert_eq!(
            missing.status,
            StatusCode::NOT_FOUND,
            "{body}: {}",
            missing.body
        );
        let r = app.put(&path, body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.message().contains(message), "{body}: {}", r.message());
        let lease = app.get(&path).await.body;
        assert_eq!(
            lease["lease"]["status"], "PENDING",
            "bad input never moves a lease to ERROR"
        );
        assert_eq!(lease["lease"]["project_id"], "admin-project");
    }
}

#[tokio::test]
async fn explicit_before_end_date_moves_its_event() {
    let app = TestApp::spawn().await;
    app.create_host("only", json!({})).await;
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
                   "before_end_date": "2030-01-01 11:45", "reservations": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let before_end = |body: &Value| -> String {
        body["lease"]["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["event_type"] == "before_end_lease")
            .unwrap()["time"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(before_end(&r.body), "2030-01-01T11:45:00.000000");
    let moved = app
        .put(
            &format!("/v1/leases/{}", id(&r)),
            json!({"end_date": "2030-01-01 13:00"}),
        )
        .await;
    assert_eq!(before_end(&moved.body), "2030-01-01T12:45:00.000000");
    let set = app
        .put(
            &format!("/v1/leases/{}", id(&r)),
            json!({"before_end_date": "2030-01-01 12:00"}),
        )
        .await;
    assert_eq!(before_end(&set.body), "2030-01-01T12:00:00.000000");
    // An empty one is none (a form's empty optional field), as in Blazar: the update leaves
    // the notice, a create has the default one.
    let kept = app
        .put(
            &format!("/v1/leases/{}", id(&r)),
            json!({"before_end_date": ""}),
        )
        .await;
    assert_eq!(kept.status, StatusCode::OK, "{}", kept.body);
    assert_eq!(before_end(&kept.body), "2030-01-01T12:00:00.000000");
    let events = |body: &Value| -> Vec<(Value, Value)> {
        body["lease"]["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["event_type"].clone(), e["time"].clone()))
            .collect()
    };
    let mut shown = Vec::new();
    for before_end_date in [json!(""), json!(null)] {
        let r = app
            .post(
                "/v1/leases",
                json!({"name": "d", "start_date": "2030-02-01 10:00", "end_date": "2030-02-01 12:00",
                       "before_end_date": before_end_date, "reservations": []}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        shown.push(events(&r.body));
    }
    assert_eq!(shown[0], shown[1]);
}

/// A create answers with the lease it wrote without reading it back; a show and a list must
/// return exactly that object (key order included), even when the clock has sub-second digits.
#[tokio::test]
async fn create_answer_equals_show_and_list() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    app.set_time(crate::harness::t(2029, 12, 31, 8, 0) + chrono::Duration::microseconds(123_456));
    let r = app
        .post(
            "/v1/leases",
            json!({
                "name": "same-everywhere", "start_date": "2030-01-01 10:00",
                "end_date": "2030-01-01 12:00", "before_end_date": "2030-01-01 11:00",
                "reservations": [
                    {"resource_type": "physical:host", "min": 1, "max": 1, "resource_properties": GPU},
                    {"resource_type": "physical:host", "min": 1, "max": 2,
                     "hypervisor_properties": "", "resource_properties": ""},
                ],
            }),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let created = serde_json::to_string(&r.body["lease"]).unwrap();
    let shown = app.get(&format!("/v1/leases/{}", id(&r))).await;
    assert_eq!(
        serde_json::to_string(&shown.body["lease"]).unwrap(),
        created
    );
    let listed = app.get("/v1/leases").await;
    assert_eq!(
        serde_json::to_string(&listed.body["leases"][0]).unwrap(),
        created
    );
    assert_eq!(r.body["lease"]["events"].as_array().unwrap().len(), 3);
    assert_eq!(r.body["lease"]["reservations"].as_array().unwrap().len(), 2);
}

/// The listed lease `lease_id` (None when the list lacks it), checked to be exactly what a
/// show returns: lists reuse rendered leases, shows never do.
async fn listed_as_shown(app: &TestApp, lease_id: &str) -> Option<Value> {
    let listed = app.get("/v1/leases").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let found = listed.body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["id"] == lease_id)
        .cloned();
    let shown = app.get(&format!("/v1/leases/{lease_id}")).await;
    match &found {
        Some(lease) => assert_eq!(
            serde_json::to_string(lease).unwrap(),
            serde_json::to_string(&shown.body["lease"]).unwrap(),
            "list and show differ"
        ),
        None => assert_eq!(shown.status, StatusCode::NOT_FOUND, "{}", shown.body),
    }
    found
}

/// Lists keep rendered leases between requests; every kind of change, made by this server or
/// by another one on the same database, shows in the next list.
#[tokio::test]
async fn lists_follow_every_change_of_a_lease() {
    let app = TestApp::spawn().await;
    let other = app.replica().await;
    three_hosts(&app).await;
    let r = app
        .host_lease("followed", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = id(&r);
    let bystander = app
        .host_lease(
            "bystander",
            "2030-02-01 10:00",
            "2030-02-01 12:00",
            1,
            1,
            "",
        )
        .await;
    assert_eq!(bystander.status, StatusCode::CREATED, "{}", bystander.body);
    for server in [&app, &other] {
        let lease = listed_as_shown(server, &lease_id).await.unwrap();
        assert_eq!(lease["end_date"], "2030-01-01T12:00:00.000000");
    }

    // Changed by the other replica: name and dates, events moved.
    let r = other
        .put(
            &format!("/v1/leases/{lease_id}"),
            json!({"name": "renamed", "end_date": "2030-01-01 13:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let lease = listed_as_shown(&app, &lease_id).await.unwrap();
    assert_eq!(lease["name"], "renamed");
    assert_eq!(lease["end_date"], "2030-01-01T13:00:00.000000");

    // The scheduler starts it: lease, reservation and event statuses.
    app.tick_at(crate::harness::t(2030, 1, 1, 10, 0)).await;
    for server in [&app, &other] {
        let lease = listed_as_shown(server, &lease_id).await.unwrap();
        assert_eq!(lease["status"], "ACTIVE");
        assert_eq!(lease["reservations"][0]["status"], "active");
    }

    // Its host goes out of service: healing swaps it and flags the reservation.
    let held = app.hosts_of(&lease_id).await;
    let r = other
        .put(
            &format!("/v1/os-hosts/{}", held[0]),
            json!({"reservable": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let shown = app.get(&format!("/v1/leases/{lease_id}")).await;
    let flags = &shown.body["lease"]["reservations"][0];
    assert!(
        flags["resources_changed"] == true || flags["missing_resources"] == true,
        "healing left no mark: {flags}"
    );
    listed_as_shown(&app, &lease_id).await.unwrap();

    // Deleted by the other replica: gone from every list; the bystander is untouched.
    let r = other.delete(&format!("/v1/leases/{lease_id}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert!(listed_as_shown(&app, &lease_id).await.is_none());
    assert!(listed_as_shown(&app, &id(&bystander)).await.is_some());
}

#[tokio::test]
async fn integer_like_strings_are_taken_and_stored_as_integers() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "strings", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
                   "reservations": [{"resource_type": "physical:host", "min": "1", "max": " 2",
                                     "hypervisor_properties": "", "resource_properties": ""}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let reservation = &r.body["lease"]["reservations"][0];
    assert_eq!(reservation["min"], json!(1));
    assert_eq!(reservation["max"], json!(2));
    let lease_id = id(&r);
    let path = format!("/v1/leases/{lease_id}");
    let rid = reservation["id"].as_str().unwrap().to_string();
    let updated = app
        .put(
            &path,
            json!({"reservations": [{"id": rid, "min": "1", "max": "1"}]}),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    assert_eq!(updated.body["lease"]["reservations"][0]["max"], json!(1));
    let shown = app.get(&path).await;
    assert_eq!(shown.body["lease"]["reservations"][0]["min"], json!(1));
    assert_eq!(shown.body["lease"]["reservations"][0]["max"], json!(1));
}

/// A NUL character, which PostgreSQL's text cannot hold, is bad input on either backend,
/// wherever it comes: never a 500.
#[tokio::test]
async fn nul_characters_are_bad_input_not_server_errors() {
    let app = TestApp::spawn().await;
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "a\u{0}b", "start_date": "2030-01-01 10:00",
                   "end_date": "2030-01-01 12:00", "reservations": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.message().contains("NUL"), "{}", r.body);
    for path in [
        "/v1/leases/x%00y",
        "/v1/leases?name=%00",
        "/v1/os-hosts/allocations?lease_id=%00",
        "/v1/floatingips/x%00y",
    ] {
        let r = app.get(path).await;
        assert!(
            r.status.is_client_error() || r.status == StatusCode::OK,
            "{path}: {} {}",
            r.status,
            r.body
        );
    }
    let r = app
        .put("/v1/leases/x%00y", json!({"name": "renamed"}))
        .await;
    assert!(r.status.is_client_error(), "{} {}", r.status, r.body);
    assert!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn oversized_property_queries_are_refused_and_write_nothing() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    // A valid query of just over 64 kB: an "or" of many conditions.
    let conditions: Vec<String> = (0..2_000)
        .map(|i| format!(r#"["==", "$gpu", "value-{i:>20}"]"#))
        .collect();
    let query = format!(r#"["or", {}]"#, conditions.join(", "));
    assert!(query.len() > 64 * 1024);
    for field in ["resource_properties", "hypervisor_properties"] {
        let mut reservation = json!({"resource_type": "physical:host", "min": 1, "max": 1,
                                     "hypervisor_properties": "", "resource_properties": ""});
        reservation[field] = json!(query);
        let r = app
            .post(
                "/v1/leases",
                json!({"name": "big", "start_date": "2030-01-01 10:00",
                       "end_date": "2030-01-01 12:00", "reservations": [reservation]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(
            r.message()
                .contains(&format!("Malformed requirements {field}: the query is")),
            "{}",
            r.message()
        );
        assert!(
            r.message().contains("the limit is 65536"),
            "{}",
            r.message()
        );
    }
    assert_eq!(app.get("/v1/leases").await.body["leases"], json!([]));
}

/// A lease list is read and written a batch of leases at a time: a list longer than a batch
/// holds every lease once, in the order of a list read in one go, shows a change to a lease
/// of a later batch, and is the same bytes whether its leases were rendered afresh or kept.
#[tokio::test]
async fn a_list_longer_than_a_batch_is_whole_in_order_and_current() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let mut created = Vec::new();
    for day in 0..260 {
        let start = crate::harness::t(2030, 1, 1, 0, 0) + chrono::Duration::days(day);
        let end = start + chrono::Duration::hours(1);
        let r = app
            .host_lease(
                &format!("lease-{day:03}"),
                &start.format("%Y-%m-%d %H:%M").to_string(),
                &end.format("%Y-%m-%d %H:%M").to_string(),
                1,
                1,
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        created.push(id(&r));
    }
    let listed = |body: &Value| -> Vec<String> {
        body["leases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["id"].as_str().unwrap().to_string())
            .collect()
    };
    // Rendered afresh, then kept: the same answer.
    let cold = app.get("/v1/leases").await;
    assert_eq!(cold.status, StatusCode::OK, "{}", cold.body);
    let warm = app.get("/v1/leases").await;
    assert_eq!(cold.body, warm.body);
    let ids = listed(&cold.body);
    assert_eq!(ids.len(), 260);
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    let mut expected = created.clone();
    expected.sort();
    assert_eq!(sorted, expected, "every lease once");
    // The order of the store's one-read list: by creation, then id.
    let order: Vec<(String, String)> = cold.body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["created_at"].as_str().unwrap().to_string(),
                l["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut in_order = order.clone();
    in_order.sort();
    assert_eq!(order, in_order);

    // A lease of the second batch renamed: the next list shows it, the rest unchanged.
    let renamed = &ids[255];
    let r = app
        .put(&format!("/v1/leases/{renamed}"), json!({"name": "renamed"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let after = app.get("/v1/leases").await;
    assert_eq!(listed(&after.body), ids);
    for (before, now) in cold.body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .zip(after.body["leases"].as_array().unwrap())
    {
        if now["id"] == renamed.as_str() {
            assert_eq!(now["name"], "renamed");
        } else {
            assert_eq!(before, now);
        }
    }
}
