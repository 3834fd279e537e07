//! Instance capacity (`virtual:instance`, `flavor:instance`), mixed leases, healing, and
//! races for every type.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestApp, t};
use crate::inventory::{device, fip, segment};

fn lease(name: &str, start: &str, end: &str, reservations: Value) -> Value {
    json!({"name": name, "start_date": start, "end_date": end, "events": [], "reservations": reservations})
}

fn instances(amount: i64, vcpus: i64, memory_mb: i64, disk_gb: i64, affinity: Value) -> Value {
    json!([{"resource_type": "virtual:instance", "amount": amount, "vcpus": vcpus, "memory_mb": memory_mb,
            "disk_gb": disk_gb, "affinity": affinity, "resource_properties": ""}])
}

async fn slots_of(app: &TestApp, lease_id: &str) -> Vec<String> {
    let r = app
        .get(&format!("/v1/os-hosts/allocations?lease_id={lease_id}"))
        .await;
    r.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != json!([]))
        .map(|a| a["resource_id"].as_str().unwrap().to_string())
        .collect()
}

/// The instance slots host `host` holds on 2030-01-01 and after, by its timeline.
pub(crate) async fn units_on(app: &TestApp, host: &str) -> i64 {
    let t = app
        .get("/v1/os-hosts/timeline?start=2030-01-01%2000:00")
        .await
        .body["timeline"]
        .clone();
    t["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["id"] == host)
        .flat_map(|r| r["busy"].as_array().unwrap().clone())
        .map(|b| b["slots"]["units"].as_i64().unwrap())
        .sum()
}

#[tokio::test]
async fn instance_capacity_is_counted_exactly_over_time() {
    let app = TestApp::spawn().await;
    // One host: 8 vCPUs, 16 GB, 100 GB.
    app.create_host(
        "c1",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
    )
    .await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(3, 2, 4096, 10, json!(null)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let res = &r.body["lease"]["reservations"][0];
    assert_eq!(res["resource_type"], "virtual:instance");
    assert_eq!(
        res["flavor_id"], res["id"],
        "the granted flavor is named after the reservation"
    );
    assert_eq!(res["affinity"], json!(null));
    assert_eq!(res["server_group_id"], json!(null));
    // The standalone backend makes no aggregate: none to show.
    assert_eq!(res["aggregate_id"], json!(null));
    // 2 vCPUs left in 10:00-12:00: one more instance fits, two do not.
    let two = app
        .post(
            "/v1/leases",
            lease(
                "b",
                "2030-01-01 11:00",
                "2030-01-01 13:00",
                instances(2, 2, 1024, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(two.status, StatusCode::CONFLICT, "{}", two.body);
    assert!(two.message().contains("free slot"), "{}", two.message());
    let one = app
        .post(
            "/v1/leases",
            lease(
                "b",
                "2030-01-01 11:00",
                "2030-01-01 13:00",
                instances(1, 2, 1024, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(one.status, StatusCode::CREATED, "{}", one.body);
    // After 12:00 only lease b uses the host: 3 instances of 2 vCPUs fit in 12:00-13:00.
    let later = app
        .post(
            "/v1/leases",
            lease(
                "c",
                "2030-01-01 12:00",
                "2030-01-01 13:00",
                instances(3, 2, 1024, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(
        later.status,
        StatusCode::CREATED,
        "usage outside the window does not count: {}",
        later.body
    );
    // Memory runs out before vCPUs do.
    let big = app
        .post(
            "/v1/leases",
            lease(
                "d",
                "2030-01-02 10:00",
                "2030-01-02 12:00",
                instances(2, 1, 9000, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(big.status, StatusCode::CONFLICT);
}

/// Blazar's instance plugin: once started, a reservation's flavor serves running servers,
/// so only its number of slots may change.
#[tokio::test]
async fn an_active_instance_reservation_changes_only_its_amount() {
    let app = TestApp::spawn().await;
    app.create_host(
        "c1",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
    )
    .await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(1, 2, 4096, 10, json!(null)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lid = r.body["lease"]["id"].as_str().unwrap().to_string();
    let rid = r.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/leases/{lid}");
    // Before the start, the size may change.
    let r = app
        .put(&path, json!({"reservations": [{"id": rid, "vcpus": 1}]}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    for change in [json!({"vcpus": 2}), json!({"memory_mb": 2048, "amount": 2})] {
        let mut entry = change.clone();
        entry["id"] = json!(rid);
        let r = app.put(&path, json!({"reservations": [entry]})).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{change}: {}", r.body);
        assert_eq!(
            r.message(),
            "An active reservation only accepts to update amount."
        );
    }
    let r = app
        .put(&path, json!({"reservations": [{"id": rid, "amount": 2}]}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["lease"]["reservations"][0]["amount"], 2);
    assert_eq!(r.body["lease"]["reservations"][0]["vcpus"], 1);
    // More than the host holds: the refusal names the reservation as the update did.
    let r = app
        .put(&path, json!({"reservations": [{"id": rid, "amount": 9}]}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.message().starts_with(&format!(
            "Not enough hosts available for reservation {rid} ("
        )),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn affinity_places_instances_on_one_or_distinct_hosts() {
    let app = TestApp::spawn().await;
    app.create_host(
        "c1",
        json!({"vcpus": 4, "memory_mb": 8192, "local_gb": 100}),
    )
    .await;
    app.create_host(
        "c2",
        json!({"vcpus": 4, "memory_mb": 8192, "local_gb": 100}),
    )
    .await;
    let same = app
        .post(
            "/v1/leases",
            lease(
                "s",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(2, 2, 1024, 10, json!(true)),
            ),
        )
        .await;
    assert_eq!(same.status, StatusCode::CREATED, "{}", same.body);
    assert_eq!(
        slots_of(&app, same.body["lease"]["id"].as_str().unwrap())
            .await
            .len(),
        1
    );
    assert!(same.body["lease"]["reservations"][0]["server_group_id"].is_string());
    let too_many = app
        .post(
            "/v1/leases",
            lease(
                "x",
                "2030-01-02 10:00",
                "2030-01-02 12:00",
                instances(3, 2, 1024, 10, json!("True")),
            ),
        )
        .await;
    assert_eq!(
        too_many.status,
        StatusCode::CONFLICT,
        "three of 2 vCPUs never fit on one 4-vCPU host"
    );
    let apart = app
        .post(
            "/v1/leases",
            lease(
                "d",
                "2030-01-03 10:00",
                "2030-01-03 12:00",
                instances(2, 1, 1024, 10, json!(false)),
            ),
        )
        .await;
    assert_eq!(apart.status, StatusCode::CREATED, "{}", apart.body);
    assert_eq!(
        slots_of(&app, apart.body["lease"]["id"].as_str().unwrap())
            .await
            .len(),
        2
    );
    let three_apart = app
        .post(
            "/v1/leases",
            lease(
                "d3",
                "2030-01-04 10:00",
                "2030-01-04 12:00",
                instances(3, 1, 1024, 10, json!("false")),
            ),
        )
        .await;
    assert_eq!(three_apart.status, StatusCode::CONFLICT);
    let bad = app
        .post(
            "/v1/leases",
            lease(
                "b",
                "2030-01-05 10:00",
                "2030-01-05 12:00",
                instances(1, 1, 1, 1, json!("sometimes")),
            ),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn allocation_ratios_multiply_capacity() {
    let app = TestApp::spawn().await;
    let id = app
        .create_host(
            "c1",
            json!({"vcpus": 2, "memory_mb": 8192, "local_gb": 100}),
        )
        .await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(4, 1, 1024, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::CONFLICT,
        "2 vCPUs hold 2 instances at ratio 1"
    );
    app.put(
        &format!("/v1/os-hosts/{id}"),
        json!({"cpu_allocation_ratio": "2.0"}),
    )
    .await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(4, 1, 1024, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn an_allocation_ratio_must_be_a_number_above_zero() {
    let app = TestApp::spawn().await;
    for bad in [
        json!("abc"),
        json!("-1"),
        json!("0"),
        json!("NaN"),
        json!("inf"),
        json!("1e400"),
        json!(""),
    ] {
        let r = app
            .post(
                "/v1/os-hosts",
                json!({"name": "c1", "vcpus": 4, "cpu_allocation_ratio": bad}),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.body);
        assert!(
            r.body["error_message"]
                .as_str()
                .is_some_and(|m| m.contains("cpu_allocation_ratio")),
            "{}",
            r.body
        );
    }
    let hosts = app.get("/v1/os-hosts").await;
    assert_eq!(hosts.body["hosts"], json!([]), "nothing was written");
    let id = app
        .create_host("c1", json!({"vcpus": 4, "ram_allocation_ratio": 1.5}))
        .await;
    let r = app
        .put(
            &format!("/v1/os-hosts/{id}"),
            json!({"disk_allocation_ratio": "-0.5"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let host = app.get(&format!("/v1/os-hosts/{id}")).await;
    assert_eq!(host.body["host"]["ram_allocation_ratio"], "1.5");
    assert!(host.body["host"].get("disk_allocation_ratio").is_none());
    // A ratio can still be removed.
    let r = app
        .put(
            &format!("/v1/os-hosts/{id}"),
            json!({"ram_allocation_ratio": null}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn server_wide_ratios_apply_to_hosts_that_set_none() {
    async fn four(app: &TestApp) -> crate::harness::Response {
        app.post(
            "/v1/leases",
            lease(
                "a",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(4, 1, 2048, 10, json!(null)),
            ),
        )
        .await
    }
    let host = json!({"vcpus": 2, "memory_mb": 4096, "local_gb": 40});
    // Blazar's default: raw totals, so 2 vCPUs hold 2 instances.
    let app = TestApp::spawn().await;
    app.create_host("c1", host.clone()).await;
    assert_eq!(four(&app).await.status, StatusCode::CONFLICT);
    // CPU alone is not enough: memory is full at 2 instances too.
    let cpu_only = blazar_service::Settings {
        ratios: blazar_service::Ratios {
            cpu: 16.0,
            ram: 1.0,
            disk: 1.0,
        },
        ..Default::default()
    };
    let app = TestApp::spawn_with(cpu_only.clone()).await;
    app.create_host("c1", host.clone()).await;
    assert_eq!(four(&app).await.status, StatusCode::CONFLICT);
    let app = TestApp::spawn_with(blazar_service::Settings {
        ratios: blazar_service::Ratios {
            ram: 2.0,
            ..cpu_only.ratios
        },
        ..cpu_only
    })
    .await;
    let id = app.create_host("c1", host.clone()).await;
    let r = four(&app).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // A host's own ratio still wins over the server's.
    app.put(
        &format!("/v1/os-hosts/{id}"),
        json!({"ram_allocation_ratio": "1.0"}),
    )
    .await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "b",
                "2030-02-01 10:00",
                "2030-02-01 12:00",
                instances(4, 1, 2048, 10, json!(null)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
}

#[tokio::test]
async fn host_and_instance_reservations_exclude_each_other() {
    let app = TestApp::spawn().await;
    app.create_host(
        "c1",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
    )
    .await;
    let host = json!([{"resource_type": "physical:host", "min": 1, "max": 1}]);
    let whole = app
        .post(
            "/v1/leases",
            lease("h", "2030-01-01 10:00", "2030-01-01 12:00", host.clone()),
        )
        .await;
    assert_eq!(whole.status, StatusCode::CREATED);
    let inst = app
        .post(
            "/v1/leases",
            lease(
                "i",
                "2030-01-01 11:00",
                "2030-01-01 13:00",
                instances(1, 1, 512, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(
        inst.status,
        StatusCode::CONFLICT,
        "a host held whole has no instance capacity"
    );
    let inst = app
        .post(
            "/v1/leases",
            lease(
                "i",
                "2030-01-01 12:00",
                "2030-01-01 13:00",
                instances(1, 1, 512, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(inst.status, StatusCode::CREATED, "{}", inst.body);
    let host_again = app
        .post(
            "/v1/leases",
            lease("h2", "2030-01-01 12:30", "2030-01-01 14:00", host),
        )
        .await;
    assert_eq!(
        host_again.status,
        StatusCode::CONFLICT,
        "a host with instances cannot be held whole"
    );
}

#[tokio::test]
async fn flavor_instance_reservations() {
    let mut app = TestApp::spawn().await;
    app.create_host(
        "c1",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
    )
    .await;
    app.create_host(
        "c2",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100, "ssd": "true"}),
    )
    .await;
    app.post(
        "/v1/flavors",
        json!({"name": "m1.large", "vcpus": 4, "ram": 8192, "disk": 40, "ephemeral": 10}),
    )
    .await;
    app.post("/v1/flavors", json!({"name": "ssd.small", "vcpus": 1, "ram": 1024, "disk": 10, "extra_specs": {"trait:ssd": "required"}})).await;
    let flavor = |name: &str, amount: i64| json!([{"resource_type": "flavor:instance", "flavor_id": name, "amount": amount, "affinity": "None"}]);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "f",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                flavor("m1.large", 3),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let res = &r.body["lease"]["reservations"][0];
    assert_eq!(res["vcpus"], 4);
    assert_eq!(res["memory_mb"], 8192);
    assert_eq!(res["disk_gb"], 50, "disk plus ephemeral");
    let source: Value = serde_json::from_str(res["resource_properties"].as_str().unwrap()).unwrap();
    assert_eq!(source["name"], "m1.large");
    let full = app
        .post(
            "/v1/leases",
            lease(
                "g",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                flavor("m1.large", 2),
            ),
        )
        .await;
    assert_eq!(full.status, StatusCode::CONFLICT, "one 4-vCPU slot is left");
    let ssd = app
        .post(
            "/v1/leases",
            lease(
                "s",
                "2030-01-02 10:00",
                "2030-01-02 12:00",
                flavor("ssd.small", 2),
            ),
        )
        .await;
    assert_eq!(ssd.status, StatusCode::CREATED, "{}", ssd.body);
    assert_eq!(
        slots_of(&app, ssd.body["lease"]["id"].as_str().unwrap()).await,
        vec!["2".to_string()]
    );
    // The trait it requires cannot be taken from the host under it, as a filtered
    // capability cannot; a change that keeps it true can be made.
    for change in [json!({"ssd": "false"}), json!({"ssd": null})] {
        let changed = app.put("/v1/os-hosts/2", change.clone()).await;
        assert_eq!(
            changed.status,
            StatusCode::CONFLICT,
            "{change}: {}",
            changed.body
        );
        assert!(changed.message().contains("ssd"), "{}", changed.message());
    }
    let changed = app.put("/v1/os-hosts/2", json!({"ssd": "True"})).await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.body);
    // A trait it forbids cannot be given to a host it holds.
    app.post("/v1/flavors", json!({"name": "plain", "vcpus": 1, "ram": 1024, "disk": 10, "extra_specs": {"trait:ssd": "forbidden"}})).await;
    let plain = app
        .post(
            "/v1/leases",
            lease(
                "p",
                "2030-01-02 10:00",
                "2030-01-02 12:00",
                flavor("plain", 1),
            ),
        )
        .await;
    assert_eq!(plain.status, StatusCode::CREATED, "{}", plain.body);
    assert_eq!(
        slots_of(&app, plain.body["lease"]["id"].as_str().unwrap()).await,
        vec!["1".to_string()]
    );
    let changed = app.put("/v1/os-hosts/1", json!({"ssd": "true"})).await;
    assert_eq!(changed.status, StatusCode::CONFLICT, "{}", changed.body);
    let changed = app.put("/v1/os-hosts/1", json!({"ssd": "no"})).await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.body);
    // A project member books by flavor too: the kept flavor is not read as a query.
    app.act_as("alpha", "alpha-user", "member");
    let member = app
        .post(
            "/v1/leases",
            lease(
                "by-member",
                "2030-01-03 10:00",
                "2030-01-03 12:00",
                flavor("ssd.small", 1),
            ),
        )
        .await;
    assert_eq!(member.status, StatusCode::CREATED, "{}", member.body);
    // Blazar's tempest scenario sends an empty resource_properties and a null affinity:
    // taken, and the kept flavor stays in resource_properties.
    let tempest_like = app
        .post(
            "/v1/leases",
            lease(
                "tempest",
                "2030-01-04 10:00",
                "2030-01-04 12:00",
                json!([{"resource_type": "flavor:instance", "flavor_id": "ssd.small",
                    "amount": 1, "affinity": null, "resource_properties": ""}]),
            ),
        )
        .await;
    assert_eq!(
        tempest_like.status,
        StatusCode::CREATED,
        "{}",
        tempest_like.body
    );
    let kept = tempest_like.body["lease"]["reservations"][0]["resource_properties"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(kept.contains("ssd.small"), "{kept}");
    app.act_as_admin();
    let missing = app
        .post(
            "/v1/leases",
            lease(
                "m",
                "2030-01-02 10:00",
                "2030-01-02 12:00",
                flavor("nope", 1),
            ),
        )
        .await;
    // Blazar's 404 in Nova's words, whichever backend.
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
    assert!(
        missing
            .message()
            .starts_with("Flavor nope could not be found."),
        "{}",
        missing.message()
    );
    // Updates work (Blazar refuses them for flavor leases).
    let lid = r.body["lease"]["id"].as_str().unwrap();
    let rid = res["id"].as_str().unwrap();
    let shrunk = app
        .put(
            &format!("/v1/leases/{lid}"),
            json!({"reservations": [{"id": rid, "amount": 1}]}),
        )
        .await;
    assert_eq!(shrunk.status, StatusCode::OK, "{}", shrunk.body);
    assert_eq!(shrunk.body["lease"]["reservations"][0]["amount"], 1);
    let more = app
        .post(
            "/v1/leases",
            lease(
                "g",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                flavor("m1.large", 2),
            ),
        )
        .await;
    assert_eq!(
        more.status,
        StatusCode::CREATED,
        "capacity freed by the update: {}",
        more.body
    );
}

#[tokio::test]
async fn a_mixed_lease_is_granted_whole_or_refused_whole() {
    let app = TestApp::spawn().await;
    app.create_host(
        "c1",
        json!({"vcpus": 16, "memory_mb": 65536, "local_gb": 500}),
    )
    .await;
    app.create_host(
        "c2",
        json!({"vcpus": 16, "memory_mb": 65536, "local_gb": 500}),
    )
    .await;
    fip(&app, "public", "172.24.4.10").await;
    segment(&app, 200, json!({})).await;
    device(&app, "gpu-1", json!({"gpu_model": "A100"})).await;
    let everything = json!([
        {"resource_type": "physical:host", "min": 1, "max": 1},
        {"resource_type": "virtual:instance", "amount": 2, "vcpus": 2, "memory_mb": 2048, "disk_gb": 20, "affinity": null},
        {"resource_type": "virtual:floatingip", "network_id": "public", "amount": 1},
        {"resource_type": "network", "network_name": "lab"},
        {"resource_type": "device", "min": 1, "max": 1, "resource_properties": "[\"==\", \"$gpu_model\", \"A100\"]"},
    ]);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "all",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                everything.clone(),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["reservations"].as_array().unwrap().len(), 5);
    let lid = r.body["lease"]["id"].as_str().unwrap();
    let shown = app
        .get(&format!("/v1/leases/{lid}?allocations=true"))
        .await
        .body;
    let units: Vec<i64> = shown["lease"]["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["allocations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["units"].as_i64().unwrap())
                .sum()
        })
        .collect();
    assert_eq!(units, [1, 2, 1, 1, 1], "what each reservation was granted");
    let fip_grant = &shown["lease"]["reservations"][2]["allocations"][0];
    assert_eq!(fip_grant["resource_type"], "virtual:floatingip");
    assert_eq!(fip_grant["resource_id"].as_str().unwrap().len(), 36);
    assert!(
        app.get(&format!("/v1/leases/{lid}")).await.body["lease"]["reservations"][0]
            .get("allocations")
            .is_none()
    );
    // The same again: the floating IP is gone, so nothing at all is granted.
    let again = app
        .post(
            "/v1/leases",
            lease("again", "2030-01-01 11:00", "2030-01-01 12:00", everything),
        )
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert!(
        again.message().contains("reservation 1"),
        "names the first unmet reservation: {}",
        again.message()
    );
    assert_eq!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // Start and end hand everything over and back.
    let lid = r.body["lease"]["id"].as_str().unwrap().to_string();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let l = app.get(&format!("/v1/leases/{lid}")).await.body;
    assert_eq!(l["lease"]["status"], "ACTIVE");
    assert!(
        l["lease"]["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] == "active")
    );
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    assert_eq!(
        app.get(&format!("/v1/leases/{lid}")).await.body["lease"]["status"],
        "TERMINATED"
    );
}

async fn held_devices(app: &TestApp, lid: &str) -> Vec<String> {
    let r = app
        .get(&format!("/v1/devices/allocations?lease_id={lid}"))
        .await;
    r.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != json!([]))
        .map(|a| a["resource_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn healing_replaces_a_failed_resource_or_degrades_the_lease() {
    let app = TestApp::spawn().await;
    let gpu1 = device(&app, "gpu-1", json!({"gpu_model": "A100"})).await;
    let gpu2 = device(&app, "gpu-2", json!({"gpu_model": "A100"})).await;
    let dev = json!([{"resource_type": "device", "min": 1, "max": 1, "resource_properties": "[\"==\", \"$gpu_model\", \"A100\"]"}]);
    let r = app
        .post(
            "/v1/leases",
            lease("g", "2030-01-01 10:00", "2030-01-01 12:00", dev),
        )
        .await;
    let lid = r.body["lease"]["id"].as_str().unwrap().to_string();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    assert_eq!(held_devices(&app, &lid).await, vec![gpu1.clone()]);

    // The granted GPU fails while a second one is free: the lease keeps a GPU.
    app.set_time(t(2030, 1, 1, 10, 30));
    let r = app
        .put(&format!("/v1/devices/{gpu1}"), json!({"reservable": false}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(held_devices(&app, &lid).await, vec![gpu2.clone()]);
    let l = app.get(&format!("/v1/leases/{lid}")).await.body["lease"].clone();
    assert_eq!(l["reservations"][0]["resources_changed"], true);
    assert_eq!(l["reservations"][0]["missing_resources"], false);
    assert_eq!(l["degraded"], false);

    // Now the replacement fails too, with no spare: degraded.
    let r = app
        .put(&format!("/v1/devices/{gpu2}"), json!({"reservable": false}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let l = app.get(&format!("/v1/leases/{lid}")).await.body["lease"].clone();
    assert_eq!(l["reservations"][0]["missing_resources"], true);
    assert_eq!(l["degraded"], true);
    assert!(held_devices(&app, &lid).await.is_empty());

    // A GPU comes back: the lease gets it and the flags clear.
    let r = app
        .put(&format!("/v1/devices/{gpu1}"), json!({"reservable": true}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let l = app.get(&format!("/v1/leases/{lid}")).await.body["lease"].clone();
    assert_eq!(l["reservations"][0]["missing_resources"], false);
    assert_eq!(l["degraded"], false);
    assert_eq!(held_devices(&app, &lid).await, vec![gpu1]);
    let notes = app.get(&format!("/v1/notifications?lease_id={lid}")).await;
    let kinds: Vec<&str> = notes.body["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "lease.create",
            "lease.event.start_lease",
            "reservation.resources_changed",
            "lease.degraded",
            "lease.healed"
        ]
    );
    // Each carries the lease's status, as every lease notification does.
    for n in notes.body["notifications"].as_array().unwrap() {
        assert!(n["payload"]["status"].is_string(), "{n}");
    }
}

#[tokio::test]
async fn healing_moves_host_reservations_and_instance_slots() {
    let app = TestApp::spawn().await;
    let h1 = app
        .create_host(
            "c1",
            json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    let h2 = app
        .create_host(
            "c2",
            json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    let whole = app
        .post(
            "/v1/leases",
            lease(
                "h",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([{"resource_type": "physical:host", "min": 1, "max": 1}]),
            ),
        )
        .await;
    let slots = app
        .post(
            "/v1/leases",
            lease(
                "i",
                "2030-01-02 10:00",
                "2030-01-02 12:00",
                instances(2, 2, 1024, 10, json!(true)),
            ),
        )
        .await;
    assert_eq!(slots.status, StatusCode::CREATED);
    let wid = whole.body["lease"]["id"].as_str().unwrap().to_string();
    let sid = slots.body["lease"]["id"].as_str().unwrap().to_string();
    assert_eq!(slots_of(&app, &wid).await, vec![h1.clone()]);
    assert_eq!(slots_of(&app, &sid).await, vec![h1.clone()]);
    let r = app
        .put(&format!("/v1/os-hosts/{h1}"), json!({"reservable": false}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(slots_of(&app, &wid).await, vec![h2.clone()]);
    assert_eq!(slots_of(&app, &sid).await, vec![h2.clone()]);
    let l = app.get(&format!("/v1/leases/{sid}")).await.body["lease"].clone();
    assert_eq!(l["reservations"][0]["resources_changed"], true);
}

/// Spread instance slots heal as far as they can: a reservation that lost both its hosts
/// gets one slot back when one returns (it waited, degraded, for both), the other when the
/// second does; affinity or not.
#[tokio::test]
async fn lost_instance_slots_come_back_one_host_at_a_time() {
    for affinity in [json!(false), json!(null)] {
        let app = TestApp::spawn().await;
        let small = json!({"vcpus": 2, "memory_mb": 4096, "local_gb": 40});
        let h1 = app.create_host("c1", small.clone()).await;
        let h2 = app.create_host("c2", small).await;
        let r = app
            .post(
                "/v1/leases",
                lease(
                    "spread",
                    "2030-01-01 10:00",
                    "2030-01-01 12:00",
                    instances(2, 2, 1024, 10, affinity.clone()),
                ),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        let id = r.body["lease"]["id"].as_str().unwrap().to_string();
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        let both = sorted(vec![h1.clone(), h2.clone()]);
        assert_eq!(sorted(slots_of(&app, &id).await), both, "{affinity}");
        let reservable = |host: String, on: bool| {
            let app = &app;
            async move {
                let r = app
                    .put(&format!("/v1/os-hosts/{host}"), json!({"reservable": on}))
                    .await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            }
        };
        let degraded = |id: String| {
            let app = &app;
            async move { app.get(&format!("/v1/leases/{id}")).await.body["lease"]["degraded"].clone() }
        };
        reservable(h1.clone(), false).await;
        reservable(h2.clone(), false).await;
        assert!(slots_of(&app, &id).await.is_empty(), "{affinity}");
        assert_eq!(degraded(id.clone()).await, true);

        reservable(h1.clone(), true).await;
        assert_eq!(slots_of(&app, &id).await, vec![h1.clone()], "{affinity}");
        assert_eq!(units_on(&app, &h1).await, 1);
        assert_eq!(degraded(id.clone()).await, true, "one slot of two is back");
        // Said at once: the reservation changed, and subscribers are told.
        let l = app.get(&format!("/v1/leases/{id}")).await.body["lease"].clone();
        assert_eq!(l["reservations"][0]["resources_changed"], true, "{l}");
        let notes = app.get(&format!("/v1/notifications?lease_id={id}")).await;
        let last = notes.body["notifications"]
            .as_array()
            .unwrap()
            .last()
            .cloned();
        assert_eq!(
            last.as_ref().map(|n| n["event_type"].clone()),
            Some(json!("reservation.resources_changed")),
            "{last:?}"
        );

        reservable(h2.clone(), true).await;
        assert_eq!(sorted(slots_of(&app, &id).await), both, "{affinity}");
        assert_eq!(degraded(id.clone()).await, false);
    }
}

/// Two leases of two 2-vCPU instances each with affinity, "first" from 10:00 to 12:00 and
/// "second" from 11:00 to 13:00: their ids.
async fn first_and_second(app: &TestApp) -> Vec<String> {
    let mut ids = Vec::new();
    for (name, start, end) in [
        ("first", "2030-01-01 10:00", "2030-01-01 12:00"),
        ("second", "2030-01-01 11:00", "2030-01-01 13:00"),
    ] {
        let r = app
            .post(
                "/v1/leases",
                lease(name, start, end, instances(2, 2, 1024, 10, json!(true))),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        ids.push(r.body["lease"]["id"].as_str().unwrap().to_string());
    }
    ids
}

/// A host's capacity for instances falls under what it was granted for (the operator's new
/// facts or ratios; the cloud's refreshed facts take the same path): the latest booking moves
/// to another host, or its lease is degraded where none has room, and it comes back when
/// capacity does.
#[tokio::test]
async fn a_host_whose_capacity_falls_sheds_instance_slots() {
    let app = TestApp::spawn().await;
    let h1 = app
        .create_host(
            "c1",
            json!({"vcpus": 4, "memory_mb": 16384, "local_gb": 100, "cpu_allocation_ratio": "2"}),
        )
        .await;
    let h2 = app
        .create_host(
            "c2",
            json!({"vcpus": 4, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    let ids = first_and_second(&app).await;
    let (first, second) = (&ids[0], &ids[1]);
    // Both fit on c1's 8 vCPUs (4 at ratio 2), packed there.
    assert_eq!(slots_of(&app, first).await, vec![h1.clone()]);
    assert_eq!(slots_of(&app, second).await, vec![h1.clone()]);
    let lease_of = |id: String| {
        let app = &app;
        async move { app.get(&format!("/v1/leases/{id}")).await.body["lease"].clone() }
    };

    // Ratio 1: c1 holds 4 vCPUs, 8 overlap from 11:00. The later booking moves to c2.
    let r = app
        .put(
            &format!("/v1/os-hosts/{h1}"),
            json!({"cpu_allocation_ratio": "1"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(slots_of(&app, first).await, vec![h1.clone()]);
    assert_eq!(slots_of(&app, second).await, vec![h2.clone()]);
    let l = lease_of(second.clone()).await;
    assert_eq!(l["reservations"][0]["resources_changed"], true);
    assert_eq!(l["degraded"], false);
    assert_eq!(
        lease_of(first.clone()).await["reservations"][0]["resources_changed"],
        false
    );

    // c2 down to 2 vCPUs: no host has room for two 2-vCPU instances together from 11:00.
    // One of them still fits on c2 and stays there (its server may run there).
    let r = app
        .put(&format!("/v1/os-hosts/{h2}"), json!({"vcpus": 2}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(slots_of(&app, second).await, vec![h2.clone()]);
    let l = lease_of(second.clone()).await;
    assert_eq!(l["reservations"][0]["missing_resources"], true);
    assert_eq!(l["degraded"], true);
    assert_eq!(lease_of(first.clone()).await["degraded"], false);

    // c1 grows to 8 vCPUs: the second lease is whole again, beside the first.
    let r = app
        .put(&format!("/v1/os-hosts/{h1}"), json!({"vcpus": 8}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(slots_of(&app, second).await, vec![h1.clone()]);
    let l = lease_of(second.clone()).await;
    assert_eq!(l["reservations"][0]["missing_resources"], false);
    assert_eq!(l["degraded"], false);
    assert_eq!(slots_of(&app, first).await, vec![h1.clone()]);
}

/// Slots a host's capacity no longer holds leave it one by one, not with the whole
/// reservation: with no room elsewhere the reservation keeps what fits and misses the rest
/// (its lease degraded) until room appears.
#[tokio::test]
async fn a_host_whose_capacity_falls_keeps_the_slots_that_still_fit() {
    let app = TestApp::spawn().await;
    let h1 = app
        .create_host(
            "c1",
            json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    let h2 = app
        .create_host(
            "c2",
            json!({"vcpus": 1, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "four",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(4, 2, 1024, 10, json!(null)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lid = r.body["lease"]["id"].as_str().unwrap().to_string();
    assert_eq!(units_on(&app, &h1).await, 4);

    // c1 down to 6 vCPUs: three 2-vCPU slots fit, and c2 has no room for the fourth.
    let r = app
        .put(&format!("/v1/os-hosts/{h1}"), json!({"vcpus": 6}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(units_on(&app, &h1).await, 3);
    assert_eq!(units_on(&app, &h2).await, 0);
    let l = app.get(&format!("/v1/leases/{lid}")).await.body["lease"].clone();
    assert_eq!(l["degraded"], true);
    assert_eq!(l["reservations"][0]["missing_resources"], true);
    // Nobody else is given the slot it misses: c1 is full, c2 too small.
    let other = app
        .post(
            "/v1/leases",
            lease(
                "other",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(1, 2, 1024, 10, json!(null)),
            ),
        )
        .await;
    assert_eq!(other.status, StatusCode::CONFLICT, "{}", other.body);

    // c2 grows to 2 vCPUs: the missing slot goes there, the three stay on c1.
    let r = app
        .put(&format!("/v1/os-hosts/{h2}"), json!({"vcpus": 2}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(units_on(&app, &h1).await, 3);
    assert_eq!(units_on(&app, &h2).await, 1);
    let l = app.get(&format!("/v1/leases/{lid}")).await.body["lease"].clone();
    assert_eq!(l["degraded"], false);
    assert_eq!(l["reservations"][0]["missing_resources"], false);
}

/// Default allocation ratios lowered across a restart (a flag changed): the next start finds
/// the instance slots over the lower capacity of hosts without ratios of their own and moves
/// them as a lowered host ratio would.
#[tokio::test]
async fn default_ratios_lowered_across_a_restart_shed_slots_at_start() {
    let db = std::sync::Arc::new(crate::harness::TestDatabase::new().await);
    let before = TestApp::builder()
        .database(db.clone())
        .settings(blazar_service::Settings {
            ratios: blazar_service::Ratios {
                cpu: 2.0,
                ..blazar_service::Ratios::default()
            },
            ..blazar_service::Settings::default()
        })
        .spawn()
        .await;
    let h1 = before
        .create_host(
            "c1",
            json!({"vcpus": 4, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    let ids = first_and_second(&before).await;
    // Both on c1's 8 vCPUs (4 at the default ratio 2).
    assert_eq!(slots_of(&before, &ids[0]).await, vec![h1.clone()]);
    assert_eq!(slots_of(&before, &ids[1]).await, vec![h1.clone()]);
    // Nothing is over capacity under the ratios it was granted with.
    assert_eq!(before.service.recheck_capacities().await.unwrap(), 0);
    let h2 = before
        .create_host(
            "c2",
            json!({"vcpus": 4, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    drop(before);

    // Restarted with the default ratio 1.0: c1 holds 4 vCPUs, 8 overlap from 11:00.
    let after = TestApp::builder().database(db).spawn().await;
    assert_eq!(after.service.recheck_capacities().await.unwrap(), 1);
    assert_eq!(slots_of(&after, &ids[0]).await, vec![h1.clone()]);
    assert_eq!(slots_of(&after, &ids[1]).await, vec![h2.clone()]);
    let l = after.get(&format!("/v1/leases/{}", ids[1])).await.body["lease"].clone();
    assert_eq!(l["reservations"][0]["resources_changed"], true);
    assert_eq!(l["degraded"], false);
    // Once moved, a further start finds nothing to do.
    assert_eq!(after.service.recheck_capacities().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_instance_reservations_never_oversubscribe_a_host() {
    let app = TestApp::spawn().await;
    app.create_host(
        "c1",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
    )
    .await;
    let requests = (0..30).map(|i| {
        app.post(
            "/v1/leases",
            lease(
                &format!("r{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(1, 1, 1024, 1, json!(null)),
            ),
        )
    });
    let responses = join_all(requests).await;
    let created = responses
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    assert_eq!(
        created, 8,
        "exactly as many 1-vCPU instances as the host has vCPUs"
    );
    assert!(
        responses
            .iter()
            .all(|r| r.status == StatusCode::CREATED || r.status == StatusCode::CONFLICT)
    );
}

/// Instance and whole-host creates racing over two hosts: a host ends up either held whole
/// by one lease or shared by instances within its capacity, never both, never over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_instance_and_host_creates_neither_mix_nor_overfill_hosts() {
    let app = TestApp::spawn().await;
    for name in ["m1", "m2"] {
        app.create_host(
            name,
            json!({"vcpus": 4, "memory_mb": 8192, "local_gb": 100}),
        )
        .await;
    }
    let whole = json!([{"resource_type": "physical:host", "min": 1, "max": 1,
                        "hypervisor_properties": "", "resource_properties": ""}]);
    let requests = (0..16).map(|i| {
        let (name, reservations) = if i % 4 == 0 {
            (format!("whole-{i}"), whole.clone())
        } else {
            (format!("slot-{i}"), instances(1, 1, 1024, 1, json!(null)))
        };
        app.post(
            "/v1/leases",
            lease(&name, "2030-01-01 10:00", "2030-01-01 12:00", reservations),
        )
    });
    let responses = join_all(requests).await;
    assert!(
        responses
            .iter()
            .all(|r| r.status == StatusCode::CREATED || r.status == StatusCode::CONFLICT),
        "{:?}",
        responses
            .iter()
            .map(|r| (r.status, r.message()))
            .collect::<Vec<_>>()
    );
    let names: std::collections::HashMap<String, String> = responses
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .map(|r| {
            (
                r.body["lease"]["id"].as_str().unwrap().to_string(),
                r.body["lease"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(!names.is_empty());
    let allocations = app.get("/v1/os-hosts/allocations").await.body["allocations"].clone();
    let mut placed = 0;
    for entry in allocations.as_array().unwrap() {
        let holders: Vec<&String> = entry["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &names[r["lease_id"].as_str().unwrap()])
            .collect();
        if holders.iter().any(|n| n.starts_with("whole-")) {
            assert_eq!(holders.len(), 1, "a host held whole is shared: {holders:?}");
        } else {
            assert!(
                holders.len() <= 4,
                "4 vCPUs hold {} instances",
                holders.len()
            );
            placed += holders.len();
        }
    }
    let slots = names.values().filter(|n| n.starts_with("slot-")).count();
    assert_eq!(placed, slots, "every instance lease holds one slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pool_reservations_grant_each_unit_once() {
    let app = TestApp::spawn().await;
    fip(&app, "public", "172.24.4.10").await;
    segment(&app, 300, json!({})).await;
    device(&app, "gpu-1", json!({})).await;
    // A floating-IP shortfall is Blazar's 400, the others 409s.
    for (reservations, refused) in [
        (
            json!([{"resource_type": "virtual:floatingip", "network_id": "public", "amount": 1}]),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!([{"resource_type": "network", "network_name": "n"}]),
            StatusCode::CONFLICT,
        ),
        (
            json!([{"resource_type": "device", "min": 1, "max": 1}]),
            StatusCode::CONFLICT,
        ),
    ] {
        let requests = (0..20).map(|i| {
            app.post(
                "/v1/leases",
                lease(
                    &format!("r{i}"),
                    "2030-01-01 10:00",
                    "2030-01-01 12:00",
                    reservations.clone(),
                ),
            )
        });
        let responses = join_all(requests).await;
        let created = responses
            .iter()
            .filter(|r| r.status == StatusCode::CREATED)
            .count();
        assert_eq!(created, 1, "{reservations}");
        assert_eq!(
            responses.iter().filter(|r| r.status == refused).count(),
            19,
            "{reservations}"
        );
    }
}

#[tokio::test]
async fn flavor_sizes_are_bounded_and_never_overflow() {
    let app = TestApp::spawn().await;
    app.create_host(
        "c1",
        json!({"vcpus": 4, "memory_mb": 8192, "local_gb": 100}),
    )
    .await;
    let max = i64::from(i32::MAX);
    let refused = [
        (
            json!({"name": "a", "vcpus": -100, "ram": 1024}),
            "Malformed parameter vcpus",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": -1}),
            "Malformed parameter ram",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": 1, "disk": -2}),
            "Malformed parameter disk",
        ),
        (
            json!({"name": "a", "vcpus": i64::MAX, "ram": 1024}),
            "Malformed parameter vcpus",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": max + 1}),
            "Malformed parameter ram",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": 1, "OS-FLV-EXT-DATA:ephemeral": -1}),
            "Malformed parameter OS-FLV-EXT-DATA:ephemeral",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": 1024, "extra_specs": {"resources:VCPU": "-100"}}),
            "Malformed extra spec resources:VCPU",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": 1024, "extra_specs": {"resources:MEMORY_MB": "9223372036854775807"}}),
            "Malformed extra spec resources:MEMORY_MB",
        ),
        (
            json!({"name": "zero", "vcpus": 1, "ram": 1, "extra_specs":
                   {"resources:VCPU": "0", "resources:MEMORY_MB": "0", "resources:DISK_GB": "0"}}),
            "asks for no vCPU, memory or disk",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": 1024, "extra_specs": {"trait:ssd": "maybe"}}),
            "Malformed parameter trait:ssd",
        ),
        // Nova's rules for ids (a path segment here), names and extra specs.
        (
            json!({"id": "a/b", "name": "a", "vcpus": 1, "ram": 1024}),
            "Malformed parameter id",
        ),
        (
            json!({"id": "a\u{0}b", "name": "a", "vcpus": 1, "ram": 1024}),
            "Malformed parameter id",
        ),
        (
            json!({"name": "a\tb", "vcpus": 1, "ram": 1024}),
            "Malformed parameter name: control characters",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": 1024, "extra_specs": {"a key/": "x"}}),
            "Malformed extra spec key",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": 1024, "extra_specs": {"hw:x": "v".repeat(256)}}),
            "Malformed extra spec hw:x",
        ),
        (
            json!({"name": "a", "vcpus": 1, "ram": 1024, "extra_specs": {"hw:x": {"deep": 1}}}),
            "Malformed extra spec hw:x",
        ),
    ];
    for (body, message) in refused {
        let r = app.post("/v1/flavors", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert!(r.message().contains(message), "{body}: {}", r.message());
    }
    let listed = app.get("/v1/flavors").await;
    assert_eq!(listed.body["flavors"], json!([]), "nothing was stored");

    // The largest sizes Nova allows are taken, and their sums do not wrap: a huge flavor is
    // simply too large for the host, and the message shows its true size.
    let huge = app
        .post(
            "/v1/flavors",
            json!({"name": "huge", "vcpus": 1, "ram": 1024, "disk": max,
                   "OS-FLV-EXT-DATA:ephemeral": max}),
        )
        .await;
    assert_eq!(huge.status, StatusCode::CREATED, "{}", huge.body);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "h",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([{"resource_type": "flavor:instance", "flavor_id": "huge",
                        "amount": max, "affinity": "None"}]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.message().contains(&format!("{} GB disk", 2 * max)),
        "{}",
        r.message()
    );
    assert!(
        !r.message().contains(" -"),
        "no negative size: {}",
        r.message()
    );
    assert_eq!(app.get("/v1/leases").await.body["leases"], json!([]));
}

/// An active instance reservation's servers run where its slots are: an extension that
/// cannot keep every slot on its host is refused, never met by moving a slot elsewhere
/// (which would also free room on that host for others while the servers still use it).
#[tokio::test]
async fn an_active_instance_reservation_never_moves_a_slot_to_extend() {
    let app = TestApp::spawn().await;
    for (name, tag) in [("c1", "a"), ("c2", "b")] {
        app.create_host(
            name,
            json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100, "tag": tag}),
        )
        .await;
    }
    let r = app
        .post(
            "/v1/leases",
            lease(
                "l",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(4, 2, 1024, 10, json!(null)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lid = r.body["lease"]["id"].as_str().unwrap().to_string();
    assert_eq!(slots_of(&app, &lid).await, ["1"], "every slot on c1");
    // Another lease takes a slot of c1 after the first one's end.
    let mut other = instances(1, 2, 1024, 10, json!(null));
    other[0]["resource_properties"] = json!(json!(["==", "$tag", "a"]).to_string());
    let r = app
        .post(
            "/v1/leases",
            lease("o", "2030-01-01 12:30", "2030-01-01 14:00", other),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let path = format!("/v1/leases/{lid}");
    assert_eq!(app.get(&path).await.body["lease"]["status"], "ACTIVE");

    // Until 13:00, c1 cannot hold the four slots and the other one at once.
    let r = app
        .put(&path, json!({"end_date": "2030-01-01 13:00"}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.message()
            .contains("reduce/replace reserved instance slots")
            && r.message().contains("on host(s) 1"),
        "{}",
        r.message()
    );
    assert_eq!(
        r.body["reasons"][0]["resource_type"], "virtual:instance",
        "{}",
        r.body
    );
    assert_eq!(slots_of(&app, &lid).await, ["1"]);
    // Nor can it give a slot back while its servers may use it (as in Blazar).
    let rid = app.get(&path).await.body["lease"]["reservations"][0]["id"].clone();
    let r = app
        .put(&path, json!({"reservations": [{"id": rid, "amount": 3}]}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(r.message().contains("reduce/replace"), "{}", r.message());
    assert_eq!(slots_of(&app, &lid).await, ["1"]);
    assert_eq!(
        app.get(&path).await.body["lease"]["end_date"],
        "2030-01-01T12:00:00.000000"
    );
    // Until 12:30 it can.
    let r = app
        .put(&path, json!({"end_date": "2030-01-01 12:30"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(slots_of(&app, &lid).await, ["1"]);
}

#[tokio::test]
async fn an_active_instance_reservation_spread_over_hosts_keeps_them_to_extend() {
    let app = TestApp::spawn().await;
    for name in ["c1", "c2"] {
        app.create_host(
            name,
            json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    }
    // Three of c1's four slots are taken until 11:00.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "o",
                "2030-01-01 10:00",
                "2030-01-01 11:00",
                instances(3, 2, 1024, 10, json!(true)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let oid = r.body["lease"]["id"].as_str().unwrap().to_string();
    assert_eq!(slots_of(&app, &oid).await, ["1"]);
    // So two slots from 10:00 go one on each host.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "l",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(2, 2, 1024, 10, json!(null)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lid = r.body["lease"]["id"].as_str().unwrap().to_string();
    let mut spread = slots_of(&app, &lid).await;
    spread.sort();
    assert_eq!(spread, ["1", "2"]);
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let path = format!("/v1/leases/{lid}");
    assert_eq!(app.get(&path).await.body["lease"]["status"], "ACTIVE");

    // c1 has room for both from 11:00, but each slot stays where it runs.
    let r = app
        .put(&path, json!({"end_date": "2030-01-01 13:00"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let mut after = slots_of(&app, &lid).await;
    after.sort();
    assert_eq!(after, ["1", "2"]);
    // And a third slot may go anywhere.
    let r = app
        .put(
            &path,
            json!({"reservations": [{"id": r.body["lease"]["reservations"][0]["id"], "amount": 3}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        app.get(&path).await.body["lease"]["end_date"],
        "2030-01-01T13:00:00.000000"
    );
}

/// Healing that adds slots on a host where the reservation already holds some leaves it two
/// allocations there; the host's allocation lists the reservation once.
#[tokio::test]
async fn a_reservation_healed_onto_a_host_it_holds_is_listed_there_once() {
    let app = TestApp::spawn().await;
    let h1 = app
        .create_host(
            "c1",
            json!({"vcpus": 4, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    let h2 = app
        .create_host(
            "c2",
            json!({"vcpus": 2, "memory_mb": 16384, "local_gb": 100}),
        )
        .await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "six",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(6, 1, 512, 1, json!(null)),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lid = r.body["lease"]["id"].as_str().unwrap().to_string();
    // Four slots on c1, two on c2; c2 grows, then c1 shrinks: c1's slots go where they fit,
    // some of them beside the two the reservation holds on c2.
    let r = app
        .put(&format!("/v1/os-hosts/{h2}"), json!({"vcpus": 4}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app
        .put(&format!("/v1/os-hosts/{h1}"), json!({"vcpus": 2}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let l = app.get(&format!("/v1/leases/{lid}")).await.body;
    assert_eq!(l["lease"]["degraded"], false, "{l}");
    for host in [&h1, &h2] {
        let r = app.get(&format!("/v1/os-hosts/{host}/allocation")).await;
        let listed = r.body["allocation"]["reservations"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(listed, 1, "{host}: {}", r.body);
    }
    let all = app.get("/v1/os-hosts/allocations").await.body;
    for entry in all["allocations"].as_array().unwrap() {
        assert_eq!(entry["reservations"].as_array().unwrap().len(), 1, "{all}");
    }
}

/// A host's capacity lowered while instance bookings race for it: what no longer fits is
/// shed or refused, never kept over the new capacity. (On PostgreSQL a booking that had
/// chosen the host before the change, and waited for the change's lock, kept its slot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lowering_a_hosts_capacity_during_a_burst_of_bookings_never_overruns_it() {
    let app = TestApp::spawn().await;
    for round in 0..8u64 {
        let pool = format!("shrinking-{round}");
        let id = app
            .create_host(
                &pool,
                json!({"vcpus": 16, "memory_mb": 65536, "local_gb": 1000, "pool": pool}),
            )
            .await;
        let bookings = (0..20).map(|i| {
            let mut reservations = instances(1, 1, 256, 1, Value::Null);
            reservations[0]["resource_properties"] = json!(format!(r#"["==", "$pool", "{pool}"]"#));
            app.post(
                "/v1/leases",
                lease(
                    &format!("burst-{round}-{i}"),
                    "2030-01-01 10:00",
                    "2030-01-01 12:00",
                    reservations,
                ),
            )
        });
        let lower = async {
            tokio::time::sleep(std::time::Duration::from_millis(round * 3)).await;
            app.put(&format!("/v1/os-hosts/{id}"), json!({"vcpus": 2}))
                .await
        };
        let (created, lowered) = tokio::join!(join_all(bookings), lower);
        assert_eq!(lowered.status, StatusCode::OK, "{}", lowered.body);
        assert!(
            created
                .iter()
                .all(|r| matches!(r.status, StatusCode::CREATED | StatusCode::CONFLICT)),
            "{:?}",
            created.iter().map(|r| r.status).collect::<Vec<_>>()
        );
        assert!(
            units_on(&app, &id).await <= 2,
            "round {round}: {} one-vCPU slots on a host of 2 vCPUs",
            units_on(&app, &id).await
        );
    }
}

/// A property of a host changed while bookings that filter on its old value race for it
/// (host and instance reservations): either the change is refused (a booking holding the
/// host filters on it) or the bookings miss the host, never both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_property_changed_under_racing_bookings_is_refused_or_they_miss_the_host() {
    let app = TestApp::spawn().await;
    for round in 0..12u64 {
        let pool = format!("moving-{round}");
        let id = app
            .create_host(
                &pool,
                json!({"vcpus": 16, "memory_mb": 65536, "local_gb": 1000, "pool": pool}),
            )
            .await;
        let filter = format!(r#"["==", "$pool", "{pool}"]"#);
        let bookings = (0..12).map(|i| {
            // Whole-host bookings a day each, and instance slots on the first day.
            let (day, reservations) = if i % 2 == 0 {
                let day = 2 + i / 2;
                (
                    day,
                    json!([{"resource_type": "physical:host", "min": 1, "max": 1,
                            "hypervisor_properties": "", "resource_properties": filter}]),
                )
            } else {
                let mut slots = instances(1, 1, 256, 1, Value::Null);
                slots[0]["resource_properties"] = json!(filter);
                (1, slots)
            };
            app.post(
                "/v1/leases",
                lease(
                    &format!("follow-{round}-{i}"),
                    &format!("2030-01-{day:02} 10:00"),
                    &format!("2030-01-{day:02} 12:00"),
                    reservations,
                ),
            )
        });
        let change = async {
            tokio::time::sleep(std::time::Duration::from_millis(round * 2)).await;
            app.put(&format!("/v1/os-hosts/{id}"), json!({"pool": "elsewhere"}))
                .await
        };
        let (_, changed) = tokio::join!(join_all(bookings), change);
        let held = app.get(&format!("/v1/os-hosts/{id}/allocation")).await;
        crate::harness::assert_refused_or_missed(round, &changed, &held, "allocation");
    }
}
