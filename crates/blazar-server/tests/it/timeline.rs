//! `GET /v1/<resources>/timeline`: the window, who sees whose leases, property queries,
//! pages, maintenance shading, instance slots with capacity, and the pool types.
//!
//! An allocation that overlaps the window only in part is shown whole, with its own dates:
//! a calendar clips what it draws, and the true start and end are what a user asks about.

use blazar_service::Settings;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Response, TestApp};
use crate::inventory::{device, fip, segment};

fn lease(name: &str, start: &str, end: &str, reservations: Value) -> Value {
    json!({"name": name, "start_date": start, "end_date": end, "events": [],
           "reservations": reservations})
}

fn hosts(n: i64) -> Value {
    json!([{"resource_type": "physical:host", "min": n, "max": n,
            "hypervisor_properties": "", "resource_properties": ""}])
}

fn host_on(props: &str) -> Value {
    json!([{"resource_type": "physical:host", "min": 1, "max": 1,
            "hypervisor_properties": "", "resource_properties": props}])
}

async fn create(app: &TestApp, body: Value) -> String {
    let r = app.post("/v1/leases", body).await;
    r.assert_status(StatusCode::CREATED);
    r.body["lease"]["id"].as_str().unwrap().to_string()
}

/// `GET path` answered 200; the timeline.
async fn timeline(app: &TestApp, path: &str) -> Value {
    let r = app.get(path).await;
    r.assert_status(StatusCode::OK);
    r.body["timeline"].clone()
}

/// The resources of a timeline by name, each with its busy intervals.
fn by_name(timeline: &Value) -> Vec<(String, Vec<Value>)> {
    timeline["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["busy"].as_array().unwrap().clone(),
            )
        })
        .collect()
}

/// The (start, end) of every interval of the resource named `name`.
fn dates_of(timeline: &Value, name: &str) -> Vec<(String, String)> {
    by_name(timeline)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap()
        .1
        .iter()
        .map(|b| {
            (
                b["start_date"].as_str().unwrap().to_string(),
                b["end_date"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[track_caller]
fn assert_bad_request(r: &Response, contains: &str) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error_code"], 400, "{}", r.body);
    assert_eq!(r.body["error_name"], 400, "{}", r.body);
    assert!(r.message().contains(contains), "{}", r.body);
}

#[tokio::test]
async fn only_allocations_overlapping_the_window_are_shown_whole() {
    let settings = Settings {
        cleaning_minutes: 30,
        ..Settings::default()
    };
    let app = TestApp::spawn_with(settings).await;
    app.create_host("compute-1", json!({})).await;
    create(
        &app,
        lease("a", "2030-01-01 10:00", "2030-01-01 12:00", hosts(1)),
    )
    .await;
    create(
        &app,
        lease("b", "2030-01-05 10:00", "2030-01-06 10:00", hosts(1)),
    )
    .await;
    create(
        &app,
        lease("c", "2030-03-01 10:00", "2030-03-02 10:00", hosts(1)),
    )
    .await;

    let t = timeline(
        &app,
        "/v1/os-hosts/timeline?start=2030-01-01%2000:00&end=2030-01-03%2000:00",
    )
    .await;
    assert_eq!(t["resource_type"], "physical:host");
    assert_eq!(t["start_date"], "2030-01-01T00:00:00.000000");
    assert_eq!(t["end_date"], "2030-01-03T00:00:00.000000");
    assert_eq!(
        dates_of(&t, "compute-1"),
        vec![(
            "2030-01-01T10:00:00.000000".to_string(),
            "2030-01-01T12:00:00.000000".to_string()
        )]
    );
    let busy = &by_name(&t)[0].1[0];
    assert_eq!(busy["blocked_until"], "2030-01-01T12:30:00.000000");
    assert_eq!(busy["status"], "PENDING");
    assert_eq!(busy["allocation"], "whole");

    // Overlapping in part: shown whole, with their own dates.
    let t = timeline(
        &app,
        "/v1/os-hosts/timeline?start=2030-01-01%2011:00&end=2030-01-05%2011:00",
    )
    .await;
    assert_eq!(
        dates_of(&t, "compute-1"),
        vec![
            (
                "2030-01-01T10:00:00.000000".to_string(),
                "2030-01-01T12:00:00.000000".to_string()
            ),
            (
                "2030-01-05T10:00:00.000000".to_string(),
                "2030-01-06T10:00:00.000000".to_string()
            ),
        ]
    );
    // The cleaning margin alone still overlaps: the host is blocked then.
    let t = timeline(
        &app,
        "/v1/os-hosts/timeline?start=2030-01-01%2012:10&end=2030-01-01%2013:00",
    )
    .await;
    assert_eq!(dates_of(&t, "compute-1").len(), 1);
    // Back to back with the window's end, or after the margin: not shown.
    for query in [
        "start=2030-01-01%2012:30&end=2030-01-05%2010:00",
        "start=2030-01-01%2000:00&end=2030-01-01%2010:00",
    ] {
        let t = timeline(&app, &format!("/v1/os-hosts/timeline?{query}")).await;
        assert_eq!(dates_of(&t, "compute-1"), vec![], "{query}");
    }

    // By default, from now (2029-12-31 08:00) for a week: a and b.
    let t = timeline(&app, "/v1/os-hosts/timeline").await;
    assert_eq!(t["start_date"], "2029-12-31T08:00:00.000000");
    assert_eq!(t["end_date"], "2030-01-07T08:00:00.000000");
    assert_eq!(dates_of(&t, "compute-1").len(), 2);
    // The format dates are sent in is accepted too, and `now`.
    let t = timeline(
        &app,
        "/v1/os-hosts/timeline?start=now&end=2030-01-01T11:00:00.000000",
    )
    .await;
    assert_eq!(t["end_date"], "2030-01-01T11:00:00.000000");
    assert_eq!(dates_of(&t, "compute-1").len(), 1);
    // A year ahead reaches c; the lease API shows the same status.
    let t = timeline(&app, "/v1/os-hosts/timeline?end=2030-12-31%2000:00").await;
    assert_eq!(dates_of(&t, "compute-1").len(), 3);
    // Started and ended leases show their status.
    app.tick_at(crate::harness::t(2030, 1, 1, 10, 0)).await;
    let t = timeline(&app, "/v1/os-hosts/timeline?start=2030-01-01%2000:00").await;
    assert_eq!(by_name(&t)[0].1[0]["status"], "ACTIVE");
    app.tick_at(crate::harness::t(2030, 1, 1, 12, 0)).await;
    let t = timeline(&app, "/v1/os-hosts/timeline?start=2030-01-01%2000:00").await;
    assert_eq!(by_name(&t)[0].1[0]["status"], "TERMINATED");
}

#[tokio::test]
async fn bad_parameters_are_400s() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let cases = [
        ("start=tomorrow", "tomorrow is an invalid start date"),
        ("end=2030-01-01%2010:00:00", "is an invalid end date"),
        (
            "start=2030-01-02%2000:00&end=2030-01-01%2000:00",
            "the end date must be later than the start date",
        ),
        (
            "start=2030-01-01%2000:00&end=2030-01-01%2000:00",
            "the end date must be later than the start date",
        ),
        (
            "start=2030-01-01%2000:00&end=2031-01-03%2000:00",
            "at most 366 days",
        ),
        ("limit=0", "Malformed parameter limit"),
        ("limit=-1", "Malformed parameter limit"),
        ("limit=ten", "Malformed parameter limit"),
        ("marker=999", "Marker 999 not found"),
        ("marker=compute-1", "Marker compute-1 not found"),
        ("query=not%20json", "Malformed parameter query"),
        ("starts=2030-01-01%2000:00", "Unknown parameter starts"),
    ];
    for (query, message) in cases {
        let r = app.get(&format!("/v1/os-hosts/timeline?{query}")).await;
        assert_bad_request(&r, message);
    }
    let r = app.get("/v1/devices/timeline?marker=nope").await;
    assert_bad_request(&r, "Marker nope not found");
}

#[tokio::test]
async fn members_see_their_own_leases_and_only_busy_for_others() {
    let mut app = TestApp::spawn().await;
    app.create_host("compute-1", json!({"rack": "r1"})).await;
    app.create_host("compute-2", json!({"rack": "r2"})).await;
    app.act_as("alpha", "alice", "member");
    let mine = create(
        &app,
        lease(
            "alice-lease",
            "2030-01-01 10:00",
            "2030-01-01 12:00",
            host_on(r#"["==", "$rack", "r1"]"#),
        ),
    )
    .await;
    app.act_as("beta", "bob", "member");
    let theirs = create(
        &app,
        lease(
            "bob-lease",
            "2030-01-01 10:00",
            "2030-01-01 12:00",
            host_on(r#"["==", "$rack", "r2"]"#),
        ),
    )
    .await;
    let path = "/v1/os-hosts/timeline?start=2030-01-01%2000:00";

    app.act_as("alpha", "alice", "member");
    let t = timeline(&app, path).await;
    let rows = by_name(&t);
    let own = &rows[0].1[0];
    assert_eq!(rows[0].0, "compute-1");
    assert_eq!(own["own"], true);
    assert_eq!(own["lease_id"], mine.as_str());
    assert_eq!(own["lease_name"], "alice-lease");
    assert_eq!(own["project_id"], "alpha");
    assert!(own["reservation_id"].is_string());
    let other = &rows[1].1[0];
    assert_eq!(rows[1].0, "compute-2");
    assert_eq!(other["own"], false);
    for hidden in ["lease_id", "lease_name", "project_id", "reservation_id"] {
        assert_eq!(other[hidden], Value::Null, "{hidden}: {other}");
    }
    assert_eq!(other["start_date"], "2030-01-01T10:00:00.000000");
    assert_eq!(other["status"], "PENDING");
    assert!(
        !t.to_string().contains("bob-lease") && !t.to_string().contains(&theirs),
        "{t}"
    );

    // A caller with no Blazar role may look too (the calendar is for every user).
    app.act_as("gamma", "carol", "observer");
    let t = timeline(&app, path).await;
    assert!(by_name(&t).iter().all(|(_, b)| b[0]["lease_id"].is_null()));

    app.act_as_admin();
    let t = timeline(&app, path).await;
    let rows = by_name(&t);
    assert_eq!(rows[0].1[0]["lease_name"], "alice-lease");
    assert_eq!(rows[1].1[0]["lease_id"], theirs.as_str());
    assert_eq!(rows[1].1[0]["project_id"], "beta");
}

#[tokio::test]
async fn a_property_query_picks_resources_and_unknown_or_private_ones_are_400s() {
    let mut app = TestApp::spawn().await;
    for (name, gpu, rack) in [
        ("compute-1", "true", "r1"),
        ("compute-2", "false", "r1"),
        ("compute-3", "true", "r2"),
        ("compute-4", "false", "r3"),
    ] {
        app.create_host(name, json!({"gpu": gpu, "rack": rack}))
            .await;
    }
    let names = |t: &Value| -> Vec<String> { by_name(t).into_iter().map(|(n, _)| n).collect() };
    let t = timeline(
        &app,
        "/v1/os-hosts/timeline?query=%5B%22%3D%3D%22%2C%22%24gpu%22%2C%22true%22%5D",
    )
    .await;
    assert_eq!(names(&t), ["compute-1", "compute-3"]);
    let or = r#"["or", ["==", "$rack", "r2"], ["==", "$rack", "r3"]]"#;
    let t = timeline(&app, &format!("/v1/os-hosts/timeline?query={}", encode(or))).await;
    assert_eq!(names(&t), ["compute-3", "compute-4"]);
    // Columns work as in a lease's filters.
    let t = timeline(
        &app,
        &format!(
            "/v1/os-hosts/timeline?query={}",
            encode(r#"["==", "$hypervisor_hostname", "compute-2"]"#)
        ),
    )
    .await;
    assert_eq!(names(&t), ["compute-2"]);

    // An unknown property: the 400 a lease create gives, naming it.
    let unknown = encode(r#"["==", "$colour", "blue"]"#);
    let r = app
        .get(&format!("/v1/os-hosts/timeline?query={unknown}"))
        .await;
    assert_bad_request(&r, "Unknown property $colour in query: no host has it");
    assert!(r.message().contains("gpu, rack"), "{}", r.message());

    // A private property is unknown to non-admins, and never named to them.
    app.patch("/v1/os-hosts/properties/rack", json!({"private": true}))
        .await
        .assert_status(StatusCode::OK);
    let by_rack = encode(r#"["==", "$rack", "r1"]"#);
    app.act_as("alpha", "alice", "member");
    let r = app
        .get(&format!("/v1/os-hosts/timeline?query={by_rack}"))
        .await;
    assert_bad_request(&r, "Unknown property $rack in query");
    assert!(
        !r.message().contains("rack,") && r.message().contains("gpu)"),
        "{}",
        r.message()
    );
    let r = app
        .get(&format!("/v1/os-hosts/timeline?query={unknown}"))
        .await;
    assert!(!r.message().contains("rack"), "{}", r.message());
    // Nor shown in the timeline itself, whatever the query.
    let t = timeline(&app, "/v1/os-hosts/timeline").await;
    assert!(!t.to_string().contains("r1"), "{t}");
    app.act_as_admin();
    let t = timeline(&app, &format!("/v1/os-hosts/timeline?query={by_rack}")).await;
    assert_eq!(names(&t), ["compute-1", "compute-2"]);
}

/// Percent-encodes a query string value.
fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[tokio::test]
async fn pages_follow_the_marker_in_id_order() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for i in 1..=5 {
        ids.push(
            app.create_host(&format!("compute-{i}"), json!({"gpu": i % 2 == 1}))
                .await,
        );
    }
    let page = |t: &Value| -> (Vec<String>, Value) {
        (
            t["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_string())
                .collect(),
            t["next_marker"].clone(),
        )
    };
    let t = timeline(&app, "/v1/os-hosts/timeline?limit=2").await;
    assert_eq!(page(&t), (ids[0..2].to_vec(), json!(ids[1])));
    let t = timeline(
        &app,
        &format!("/v1/os-hosts/timeline?limit=2&marker={}", ids[1]),
    )
    .await;
    assert_eq!(page(&t), (ids[2..4].to_vec(), json!(ids[3])));
    let t = timeline(
        &app,
        &format!("/v1/os-hosts/timeline?limit=2&marker={}", ids[3]),
    )
    .await;
    assert_eq!(page(&t), (ids[4..5].to_vec(), Value::Null));
    let t = timeline(&app, "/v1/os-hosts/timeline?limit=5").await;
    assert_eq!(page(&t), (ids.clone(), Value::Null));
    let t = timeline(&app, "/v1/os-hosts/timeline").await;
    assert_eq!(page(&t), (ids.clone(), Value::Null));
    // With a query, pages count matching resources only; the marker still places them.
    let gpu = encode(r#"["==", "$gpu", "1"]"#);
    let t = timeline(&app, &format!("/v1/os-hosts/timeline?limit=2&query={gpu}")).await;
    assert_eq!(
        page(&t),
        (vec![ids[0].clone(), ids[2].clone()], json!(ids[2]))
    );
    let t = timeline(
        &app,
        &format!(
            "/v1/os-hosts/timeline?limit=2&query={gpu}&marker={}",
            ids[2]
        ),
    )
    .await;
    assert_eq!(page(&t), (vec![ids[4].clone()], Value::Null));
}

#[tokio::test]
async fn non_reservable_resources_are_shaded_over_the_window() {
    let app = TestApp::spawn().await;
    let host = app.create_host("compute-1", json!({})).await;
    app.create_host("compute-2", json!({})).await;
    app.put(
        &format!("/v1/os-hosts/{host}"),
        json!({"reservable": false}),
    )
    .await
    .assert_status(StatusCode::OK);
    let t = timeline(
        &app,
        "/v1/os-hosts/timeline?start=2030-01-01%2000:00&end=2030-01-02%2000:00",
    )
    .await;
    let resources = t["resources"].as_array().unwrap();
    assert_eq!(resources[0]["reservable"], false);
    assert_eq!(
        resources[0]["non_reservable"],
        json!([{"start_date": "2030-01-01T00:00:00.000000",
                "end_date": "2030-01-02T00:00:00.000000"}])
    );
    assert_eq!(resources[1]["reservable"], true);
    assert_eq!(resources[1]["non_reservable"], json!([]));
}

#[tokio::test]
async fn instance_slots_are_shown_with_the_hosts_capacity() {
    let app = TestApp::spawn().await;
    app.create_host(
        "compute-1",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100, "cpu_allocation_ratio": "2.0"}),
    )
    .await;
    let slots = json!([{"resource_type": "virtual:instance", "amount": 3, "vcpus": 2,
                        "memory_mb": 1024, "disk_gb": 10, "affinity": true,
                        "resource_properties": ""}]);
    create(
        &app,
        lease("vms", "2030-01-01 10:00", "2030-01-01 12:00", slots),
    )
    .await;
    let t = timeline(&app, "/v1/os-hosts/timeline?start=2030-01-01%2000:00").await;
    let host = &t["resources"][0];
    assert_eq!(
        host["instance_capacity"],
        json!({"vcpus": 16, "memory_mb": 16384, "disk_gb": 100})
    );
    let busy = &host["busy"][0];
    assert_eq!(busy["allocation"], "instances");
    assert_eq!(
        busy["slots"],
        json!({"units": 3, "vcpus": 2, "memory_mb": 1024, "disk_gb": 10})
    );
    assert_eq!(busy["lease_name"], "vms");
}

#[tokio::test]
async fn floating_ips_networks_and_devices_have_timelines() {
    let app = TestApp::spawn().await;
    let address = fip(&app, "net-1", "172.24.4.10").await;
    fip(&app, "net-1", "172.24.4.11").await;
    let network = segment(&app, 1001, json!({})).await;
    let gpu = device(&app, "gpu-1", json!({"model": "A100"})).await;
    device(&app, "gpu-2", json!({"model": "H100"})).await;
    let reservations = json!([
        {"resource_type": "virtual:floatingip", "network_id": "net-1", "amount": 1,
         "required_floatingips": ["172.24.4.10"]},
        {"resource_type": "network", "network_name": "n", "resource_properties": ""},
        {"resource_type": "device", "min": 1, "max": 1,
         "resource_properties": r#"["==", "$model", "A100"]"#},
    ]);
    create(
        &app,
        lease(
            "pools",
            "2030-01-01 10:00",
            "2030-01-01 12:00",
            reservations,
        ),
    )
    .await;
    let window = "start=2030-01-01%2000:00&end=2030-01-02%2000:00";
    for (path, kind, held, name, count) in [
        (
            "floatingips",
            "virtual:floatingip",
            &address,
            "172.24.4.10",
            2,
        ),
        ("networks", "network", &network, "physnet1:1001", 1),
        ("devices", "device", &gpu, "gpu-1", 2),
    ] {
        let t = timeline(&app, &format!("/v1/{path}/timeline?{window}")).await;
        assert_eq!(t["resource_type"], kind);
        let resources = t["resources"].as_array().unwrap();
        assert_eq!(resources.len(), count, "{t}");
        let holder = resources.iter().find(|r| r["id"] == held.as_str()).unwrap();
        assert_eq!(holder["name"], name);
        assert_eq!(holder["busy"][0]["lease_name"], "pools");
        assert_eq!(holder["busy"][0]["allocation"], "whole");
        assert!(holder.get("instance_capacity").is_none(), "{holder}");
        for other in resources.iter().filter(|r| r["id"] != held.as_str()) {
            assert_eq!(other["busy"], json!([]));
        }
    }
    // A query on a pool's own capability, and a page of one.
    let model = encode(r#"["==", "$model", "H100"]"#);
    let t = timeline(&app, &format!("/v1/devices/timeline?query={model}")).await;
    assert_eq!(
        by_name(&t).into_iter().map(|(n, _)| n).collect::<Vec<_>>(),
        ["gpu-2"]
    );
    let t = timeline(&app, "/v1/floatingips/timeline?limit=1").await;
    assert_eq!(t["resources"][0]["id"], address.as_str());
    assert_eq!(t["next_marker"], address.as_str());
    let t = timeline(
        &app,
        &format!("/v1/floatingips/timeline?limit=1&marker={address}"),
    )
    .await;
    assert_eq!(t["resources"][0]["name"], "172.24.4.11");
    assert_eq!(t["next_marker"], Value::Null);
}

/// What a calendar groups rows by: the properties with their values, readable by members
/// under the timeline's rule (Blazar's own property listing is for admins), private ones
/// for admins only.
#[tokio::test]
async fn the_timeline_lists_the_properties_to_group_by_for_members_too() {
    let mut app = TestApp::spawn().await;
    for (name, node_type, rack) in [
        ("compute-1", "gpu", "r1"),
        ("compute-2", "cpu", "r1"),
        ("compute-3", "gpu", "r2"),
    ] {
        app.create_host(name, json!({"node_type": node_type, "rack": rack}))
            .await;
    }
    app.patch("/v1/os-hosts/properties/rack", json!({"private": true}))
        .await
        .assert_status(StatusCode::OK);
    let listed = |r: &crate::harness::Response| -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = r.body["resource_properties"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let mut values: Vec<String> = p["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect();
                values.sort();
                (p["property"].as_str().unwrap().to_string(), values)
            })
            .collect();
        out.sort();
        out
    };
    let r = app.get("/v1/os-hosts/timeline/properties").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        listed(&r),
        [
            (
                "node_type".to_string(),
                vec!["cpu".to_string(), "gpu".to_string()]
            ),
            ("rack".to_string(), vec!["r1".to_string(), "r2".to_string()]),
        ]
    );
    app.act_as("alpha", "ada", "member");
    assert_eq!(
        app.get("/v1/os-hosts/properties").await.status,
        StatusCode::FORBIDDEN
    );
    let r = app.get("/v1/os-hosts/timeline/properties").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        listed(&r),
        [(
            "node_type".to_string(),
            vec!["cpu".to_string(), "gpu".to_string()]
        )]
    );
    let r = app.get("/v1/devices/timeline/properties").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body, json!({"resource_properties": []}));
}

/// The timeline is read a batch of resources at a time, the batches sized by how many
/// allocations the last one held: with a target of one allocation a batch, the first batch
/// of 250 hosts is followed by batches of a host or two. The answer is the same whole page,
/// in id order, every interval on its own host, and reads as the client's type.
#[tokio::test]
async fn a_timeline_read_in_many_batches_is_whole_and_in_order() {
    let app = TestApp::spawn_with(Settings {
        list_batch_allocations: 1,
        ..Settings::default()
    })
    .await;
    let mut hosts = Vec::new();
    for i in 0..270 {
        hosts.push(
            app.create_host(
                &format!("compute-{i:03}"),
                json!({"n": i, "even": i % 2 == 0}),
            )
            .await,
        );
    }
    // Every third host is leased, twice on the last ones.
    let mut expected: Vec<(String, Vec<String>)> =
        hosts.iter().map(|h| (h.clone(), Vec::new())).collect();
    for (i, slot) in expected.iter_mut().enumerate().step_by(3) {
        let days: &[(&str, &str)] = if i >= 240 {
            &[
                ("2030-01-01 10:00", "2030-01-01 12:00"),
                ("2030-01-02 10:00", "2030-01-02 12:00"),
            ]
        } else {
            &[("2030-01-01 10:00", "2030-01-01 12:00")]
        };
        for (k, (start, end)) in days.iter().enumerate() {
            let id = create(
                &app,
                lease(
                    &format!("l{i}-{k}"),
                    start,
                    end,
                    host_on(&format!(r#"["==", "$n", "{i}"]"#)),
                ),
            )
            .await;
            slot.1.push(id);
        }
    }
    let path = "/v1/os-hosts/timeline?start=2030-01-01%2000:00&end=2030-01-03%2000:00";
    let r = app.get(path).await;
    r.assert_status(StatusCode::OK);
    assert_eq!(r.headers["content-type"], "application/json");
    let typed: blazar_api::Timeline = serde_json::from_value(r.body["timeline"].clone()).unwrap();
    assert_eq!(typed.resource_type, "physical:host");
    assert_eq!(typed.next_marker, None);
    let seen: Vec<(String, Vec<String>)> = typed
        .resources
        .iter()
        .map(|r| {
            let leases = r.busy.iter().map(|b| b.lease_id.clone().unwrap()).collect();
            (r.id.clone(), leases)
        })
        .collect();
    assert_eq!(seen, expected);
    // A page cut by the limit, after a marker, across batches as well.
    let t = timeline(&app, &format!("{path}&limit=200&marker={}", hosts[9])).await;
    let ids: Vec<&str> = t["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        hosts[10..210]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    assert_eq!(t["next_marker"], json!(hosts[209]));
}
