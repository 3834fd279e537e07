//! Every route's response pinned by a snapshot (`tests/it/snapshots/`): one test per area,
//! each route called once, status and body recorded with ids, request ids and record times
//! redacted, so the same snapshots hold on SQLite and PostgreSQL. What a response means is
//! checked key by key in the other modules; these catch any change of shape.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, Transcript, t};

/// Snapshots a transcript under `name`.
macro_rules! assert_transcript {
    ($name:expr, $transcript:expr) => {
        insta::assert_snapshot!($name, $transcript.finish())
    };
}

fn id(r: &crate::harness::Response, key: &str) -> String {
    assert!(r.status.is_success(), "{}", r.body);
    r.body[key]["id"].as_str().unwrap().to_string()
}

fn lease_body(name: &str, reservations: Value) -> Value {
    json!({"name": name, "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
           "events": [], "reservations": reservations})
}

fn host_reservation() -> Value {
    json!({"resource_type": "physical:host", "min": 1, "max": 1,
           "hypervisor_properties": "", "resource_properties": ""})
}

/// Creates the first lease at the clock's time, and moves the clock a minute, so that
/// leases listed by creation come in one order on every backend.
async fn create_lease(s: &mut Transcript<'_>, app: &TestApp, body: Value) -> String {
    let r = s.post("/v1/leases", body).await;
    app.set_time(app.service.now() + chrono::Duration::minutes(1));
    id(&r, "lease")
}

#[tokio::test]
async fn version_document() {
    let app = TestApp::spawn().await;
    let mut s = Transcript::new(&app);
    s.get("/").await;
    s.get("/versions").await;
    s.get("/versions.json").await;
    s.get("/healthz").await;
    assert_transcript!("version_document", s);
}

#[tokio::test]
async fn leases() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    inventory_setup(&app).await;
    let mut s = Transcript::new(&app);
    let lease = create_lease(
        &mut s,
        &app,
        lease_body(
            "everything",
            json!([
                host_reservation(),
                {"resource_type": "network", "network_name": "my-net", "resource_properties": ""},
                {"resource_type": "device", "min": 1, "max": 1, "resource_properties": ""},
            ]),
        ),
    )
    .await;
    let other = create_lease(&mut s, &app, {
        let mut body = lease_body("later", json!([host_reservation()]));
        body["start_date"] = json!("2030-01-02 10:00");
        body["end_date"] = json!("2030-01-02 12:00");
        body
    })
    .await;
    s.get("/v1/leases").await;
    s.get(&format!("/v1/leases/{lease}")).await;
    s.put(
        &format!("/v1/leases/{lease}"),
        json!({"name": "renamed", "end_date": "2030-01-01 13:00"}),
    )
    .await;
    s.note("the lease starts");
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    s.get(&format!("/v1/leases/{lease}")).await;
    s.get(&format!("/v1/leases/{lease}/actions")).await;
    s.get(&format!("/v1/leases/{lease}/hosts")).await;
    s.get(&format!("/v1/leases/{lease}/networks")).await;
    s.get(&format!("/v1/leases/{lease}/devices")).await;
    s.get(&format!("/v1/notifications?lease_id={lease}")).await;
    s.delete(&format!("/v1/leases/{other}")).await;
    s.get("/v1/leases").await;
    assert_transcript!("leases", s);
}

#[tokio::test]
async fn hosts() {
    let app = TestApp::spawn().await;
    let mut s = Transcript::new(&app);
    let r = s
        .post(
            "/v1/os-hosts",
            json!({"name": "compute-1", "vcpus": 16, "memory_mb": 65536, "local_gb": 500,
                   "rack": "r1", "gpu": "true"}),
        )
        .await;
    let host = id(&r, "host");
    let spare = id(
        &s.post("/v1/os-hosts", json!({"name": "compute-2"})).await,
        "host",
    );
    s.get("/v1/os-hosts").await;
    s.get(&format!("/v1/os-hosts/{host}")).await;
    s.put(
        &format!("/v1/os-hosts/{host}"),
        json!({"rack": "r2", "gpu": null}),
    )
    .await;
    s.delete(&format!("/v1/os-hosts/{spare}")).await;
    s.note("a lease holds compute-1 and starts");
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    r.assert_status(StatusCode::CREATED);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    s.get("/v1/handovers").await;
    s.post("/v1/reconcile", json!({"dry_run": true})).await;
    assert_transcript!("hosts", s);
}

/// A floating IP, two network segments and two devices, with their extra properties.
async fn inventory_setup(app: &TestApp) {
    for (path, body) in [
        (
            "/v1/floatingips",
            json!({"floating_network_id": "net-1", "floating_ip_address": "172.24.4.101"}),
        ),
        (
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 100,
                   "tier": "gold"}),
        ),
        (
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 101}),
        ),
        (
            "/v1/devices",
            json!({"name": "gpu-1", "device_type": "gpu", "device_driver": "k8s",
                   "gpu_model": "A100"}),
        ),
        (
            "/v1/devices",
            json!({"name": "gpu-2", "device_type": "gpu", "device_driver": "k8s",
                   "gpu_model": "A100"}),
        ),
    ] {
        app.post(path, body)
            .await
            .assert_status(StatusCode::CREATED);
    }
}

/// The ids of a kind's inventory, in list order.
async fn ids(app: &TestApp, kind: &str) -> Vec<String> {
    app.get(&format!("/v1/{kind}")).await.body[kind]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn allocations() {
    let app = TestApp::spawn().await;
    let h1 = app.create_host("compute-1", json!({})).await;
    app.create_host("compute-2", json!({})).await;
    inventory_setup(&app).await;
    let r = app
        .post(
            "/v1/leases",
            lease_body(
                "l",
                json!([
                    host_reservation(),
                    {"resource_type": "virtual:floatingip", "network_id": "net-1", "amount": 1},
                    {"resource_type": "network", "network_name": "n", "resource_properties": ""},
                    {"resource_type": "device", "min": 1, "max": 1, "resource_properties": ""},
                ]),
            ),
        )
        .await;
    let lease = id(&r, "lease");
    let held = app.hosts_of(&lease).await;
    let mut s = Transcript::new(&app);
    s.get("/v1/os-hosts/allocations").await;
    s.get(&format!("/v1/os-hosts/allocations?lease_id={lease}"))
        .await;
    s.get(&format!("/v1/os-hosts/{h1}/allocation")).await;
    s.put(
        &format!("/v1/os-hosts/{}/allocation", held[0]),
        json!({"lease_id": lease}),
    )
    .await;
    for kind in ["floatingips", "networks", "devices"] {
        s.get(&format!("/v1/{kind}/allocations")).await;
        let first = ids(&app, kind).await.remove(0);
        s.get(&format!("/v1/{kind}/{first}/allocation")).await;
    }
    let allocated: Vec<String> = app
        .get(&format!("/v1/devices/allocations?lease_id={lease}"))
        .await
        .body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != json!([]))
        .map(|a| a["resource_id"].as_str().unwrap().to_string())
        .collect();
    s.put(
        &format!("/v1/devices/{}/allocation", allocated[0]),
        json!({"lease_id": lease}),
    )
    .await;
    assert_transcript!("allocations", s);
}

/// Create, list, show, update and delete of one pool kind.
async fn pool_routes(kind: &str, one: &str, create: Value, update: Value) -> String {
    let app = TestApp::spawn().await;
    let mut s = Transcript::new(&app);
    let r = s.post(&format!("/v1/{kind}"), create).await;
    let id = id(&r, one);
    s.get(&format!("/v1/{kind}")).await;
    s.get(&format!("/v1/{kind}/{id}")).await;
    s.put(&format!("/v1/{kind}/{id}"), update).await;
    s.delete(&format!("/v1/{kind}/{id}")).await;
    s.get(&format!("/v1/{kind}")).await;
    s.finish()
}

#[tokio::test]
async fn floating_ips() {
    let text = pool_routes(
        "floatingips",
        "floatingip",
        json!({"floating_network_id": "net-1", "floating_ip_address": "172.24.4.101"}),
        json!({"reservable": false}),
    )
    .await;
    insta::assert_snapshot!("floating_ips", text);
}

#[tokio::test]
async fn networks() {
    let text = pool_routes(
        "networks",
        "network",
        json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 100,
               "tier": "gold"}),
        json!({"tier": "silver"}),
    )
    .await;
    insta::assert_snapshot!("networks", text);
}

#[tokio::test]
async fn devices() {
    let text = pool_routes(
        "devices",
        "device",
        json!({"name": "gpu-1", "device_type": "gpu", "device_driver": "k8s",
               "gpu_model": "A100"}),
        json!({"gpu_model": "H100"}),
    )
    .await;
    insta::assert_snapshot!("devices", text);
}

#[tokio::test]
async fn flavors() {
    let app = TestApp::spawn().await;
    let mut s = Transcript::new(&app);
    let r = s
        .post(
            "/v1/flavors",
            json!({"name": "m1.small", "vcpus": 2, "ram": 4096, "disk": 20,
                   "extra_specs": {"hw:cpu_policy": "shared"}}),
        )
        .await;
    let flavor = id(&r, "flavor");
    s.get("/v1/flavors").await;
    s.get(&format!("/v1/flavors/{flavor}")).await;
    s.delete(&format!("/v1/flavors/{flavor}")).await;
    s.get("/v1/flavors").await;
    assert_transcript!("flavors", s);
}

#[tokio::test]
async fn properties() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({"rack": "r1", "gpu": "true"}))
        .await;
    app.create_host("compute-2", json!({"rack": "r2"})).await;
    inventory_setup(&app).await;
    let mut s = Transcript::new(&app);
    s.get("/v1/os-hosts/properties").await;
    s.get("/v1/os-hosts/properties?detail=True").await;
    s.patch("/v1/os-hosts/properties/rack", json!({"private": true}))
        .await;
    s.get("/v1/os-hosts/properties?detail=True&all=True").await;
    for (kind, name) in [
        ("floatingips", "floating_network_id"),
        ("networks", "tier"),
        ("devices", "gpu_model"),
    ] {
        s.get(&format!("/v1/{kind}/properties?detail=True")).await;
        s.patch(
            &format!("/v1/{kind}/properties/{name}"),
            json!({"private": true}),
        )
        .await;
    }
    assert_transcript!("properties", s);
}

#[tokio::test]
async fn errors() {
    let mut app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let mut s = Transcript::new(&app);
    // The framework's shape: unknown URLs, wrong methods, microversions.
    s.get("/v1/nothing-here").await;
    s.get("/v2/leases").await;
    s.call(Method::PATCH, "/v1/leases", Some(json!({}))).await;
    for version in ["reservation 1.x", "reservation 1.1"] {
        let r = app
            .call(
                None,
                Method::GET,
                "/v1/leases",
                None,
                &[("OpenStack-API-Version", version)],
            )
            .await;
        s.record(
            &Method::GET,
            &format!("/v1/leases (OpenStack-API-Version: {version})"),
            None,
            &r,
        );
    }
    // The application's shape: bad requests, missing objects, conflicts.
    let r = app
        .raw(Method::POST, "/v1/leases", "application/json", "{not json")
        .await;
    s.record(&Method::POST, "/v1/leases ({not json)", None, &r);
    let r = app
        .raw(Method::POST, "/v1/leases", "text/plain", "{}")
        .await;
    s.record(&Method::POST, "/v1/leases (text/plain)", None, &r);
    s.post("/v1/leases", json!({"name": "x", "colour": "red"}))
        .await;
    s.post(
        "/v1/leases",
        json!({"name": "x", "start_date": "2030-01-01 12:00", "end_date": "2030-01-01 10:00",
               "reservations": [host_reservation()]}),
    )
    .await;
    s.get("/v1/leases/00000000-0000-0000-0000-000000000000")
        .await;
    s.get("/v1/os-hosts/999").await;
    let mut two = host_reservation();
    two["min"] = json!(2);
    two["max"] = json!(2);
    s.post("/v1/leases", lease_body("too-many", json!([two])))
        .await;
    s.post("/v1/os-hosts", json!({"name": "compute-1"})).await;
    let mut text = s.finish();
    // Policy: a member may not manage the inventory.
    app.act_as("alpha", "alice", "member");
    let mut s = Transcript::new(&app);
    s.note("as a member of project alpha");
    s.get("/v1/os-hosts").await;
    s.post("/v1/os-hosts", json!({"name": "compute-9"})).await;
    text.push_str(&s.finish());
    insta::assert_snapshot!("errors", text);
}

#[tokio::test]
async fn timeline() {
    let mut app = TestApp::spawn().await;
    app.create_host(
        "compute-1",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
    )
    .await;
    let spare = app.create_host("compute-2", json!({})).await;
    app.put(
        &format!("/v1/os-hosts/{spare}"),
        json!({"reservable": false}),
    )
    .await
    .assert_status(StatusCode::OK);
    app.create_host("compute-3", json!({})).await;
    app.post(
        "/v1/devices",
        json!({"name": "gpu-1", "device_type": "gpu", "device_driver": "k8s"}),
    )
    .await
    .assert_status(StatusCode::CREATED);
    app.host_lease("whole", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await
        .assert_status(StatusCode::CREATED);
    app.act_as("alpha", "alice", "member");
    app.post(
        "/v1/leases",
        lease_body(
            "slots",
            json!([{"resource_type": "virtual:instance", "amount": 2, "vcpus": 2,
                    "memory_mb": 1024, "disk_gb": 10, "affinity": true,
                    "resource_properties": ""}]),
        ),
    )
    .await
    .assert_status(StatusCode::CREATED);
    app.post(
        "/v1/leases",
        lease_body(
            "device",
            json!([{"resource_type": "device", "min": 1, "max": 1, "resource_properties": ""}]),
        ),
    )
    .await
    .assert_status(StatusCode::CREATED);
    app.act_as_admin();
    let mut s = Transcript::new(&app);
    s.note("as an admin");
    s.get("/v1/os-hosts/timeline?start=2030-01-01%2000:00&end=2030-01-02%2000:00")
        .await;
    s.get("/v1/os-hosts/timeline?start=2030-01-01%2000:00&limit=1")
        .await;
    s.get("/v1/os-hosts/timeline?start=yesterday").await;
    let mut text = s.finish();
    app.act_as("beta", "bob", "member");
    let mut s = Transcript::new(&app);
    s.note("as a member of project beta");
    s.get("/v1/os-hosts/timeline?start=2030-01-01%2000:00&end=2030-01-02%2000:00")
        .await;
    s.get("/v1/devices/timeline?start=2030-01-01%2000:00&end=2030-01-02%2000:00")
        .await;
    text.push_str(&s.finish());
    insta::assert_snapshot!("timeline", text);
}
