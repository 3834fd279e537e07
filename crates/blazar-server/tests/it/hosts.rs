//! `/v1/os-hosts`: inventory, properties, allocations.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::TestApp;

#[tokio::test]
async fn create_show_list_hosts() {
    let app = TestApp::spawn().await;
    let r = app
        .post(
            "/v1/os-hosts",
            json!({"name": "compute-2", "vcpus": 16, "memory_mb": "65536", "local_gb": 500,
                   "hypervisor_type": "QEMU", "gpu": "true", "rack": "r1"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let host = &r.body["host"];
    assert_eq!(host["id"], "1");
    assert_eq!(host["hypervisor_hostname"], "compute-2");
    assert_eq!(host["service_name"], "compute-2");
    assert_eq!(host["vcpus"], 16);
    assert_eq!(host["memory_mb"], 65536);
    assert_eq!(host["gpu"], "true");
    assert_eq!(host["rack"], "r1");
    assert_eq!(host["reservable"], true);
    assert_eq!(host["status"], json!(null));
    assert_eq!(host["updated_at"], json!(null));
    assert_eq!(host["trust_id"].as_str().unwrap().len(), 32);
    let keys: Vec<&String> = host.as_object().unwrap().keys().collect();
    for key in [
        "availability_zone",
        "cpu_info",
        "created_at",
        "hypervisor_hostname",
        "hypervisor_type",
        "hypervisor_version",
        "id",
        "local_gb",
        "memory_mb",
        "reservable",
        "service_name",
        "status",
        "trust_id",
        "updated_at",
        "vcpus",
    ] {
        assert!(host.get(key).is_some(), "missing {key} in {keys:?}");
    }

    let defaults = app.post("/v1/os-hosts", json!({"name": "compute-9"})).await;
    assert_eq!(defaults.body["host"]["id"], "2");
    assert!(defaults.body["host"]["vcpus"].as_i64().unwrap() > 0);

    let shown = app.get("/v1/os-hosts/1").await;
    assert_eq!(shown.status, StatusCode::OK);
    assert_eq!(shown.body["host"], *host);
    let listed = app.get("/v1/os-hosts").await;
    assert_eq!(listed.body["hosts"].as_array().unwrap().len(), 2);
    let filtered = app.get("/v1/os-hosts?hypervisor_hostname=compute-9").await;
    assert_eq!(filtered.body["hosts"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn host_creation_errors() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let long_key = "k".repeat(65);
    let cases = [
        (
            json!({"name": "compute-1"}),
            StatusCode::CONFLICT,
            "already registered",
        ),
        // Blazar's InvalidHost: neither a name nor an id.
        (
            json!({}),
            StatusCode::FORBIDDEN,
            "Invalid values for host {}",
        ),
        (
            json!({"gpu": "true"}),
            StatusCode::FORBIDDEN,
            "Invalid values for host {\"gpu\":\"true\"}",
        ),
        (
            json!({"name": ""}),
            StatusCode::BAD_REQUEST,
            "Missing parameter name",
        ),
        (
            json!({"name": 7}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter name",
        ),
        (
            json!({"name": "c2", long_key.clone(): "v"}),
            StatusCode::BAD_REQUEST,
            "Extra capability key too long",
        ),
        (
            json!({"name": "c2", "c\u{0}p": "v"}),
            StatusCode::BAD_REQUEST,
            "extra capability name: control characters are not allowed",
        ),
        (
            json!({"name": "c2", "c\np": "v"}),
            StatusCode::BAD_REQUEST,
            "extra capability name: control characters are not allowed",
        ),
        (
            json!({"name": "c2", "vcpus": "many"}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter vcpus",
        ),
        (
            json!({"name": "c2", "vcpus": 4_611_686_018_427_387_904_i64}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter vcpus: expected an integer from 0 to 2147483647",
        ),
        (
            json!({"name": "c2", "memory_mb": 2_147_483_648_i64}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter memory_mb: expected an integer from 0 to 2147483647",
        ),
        (
            json!({"name": "c2", "id": "77"}),
            StatusCode::BAD_REQUEST,
            "id is set by the server",
        ),
        (
            json!({"name": "c2", "trust_id": "x"}),
            StatusCode::BAD_REQUEST,
            "trust_id is set by the server",
        ),
        (
            json!({"name": "c2", "gpu": {"nested": true}}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter gpu",
        ),
        // Names reach logs and aggregates: no control characters, Blazar's lengths.
        (
            json!({"name": "c2\nfake log line"}),
            StatusCode::BAD_REQUEST,
            "control characters",
        ),
        (
            json!({"name": "c\u{0}2"}),
            StatusCode::BAD_REQUEST,
            "control characters",
        ),
        (
            json!({"name": "c2", "availability_zone": "z".repeat(256)}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter availability_zone: at most 255",
        ),
        (
            json!({"name": "c2", "service_name": "c2\r"}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter service_name: control characters",
        ),
        (
            json!({"name": "c2", "cpu_info": "x".repeat(65_536)}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter cpu_info: at most 65535",
        ),
        (
            json!({"name": "c2", "gpu": "x".repeat(65_536)}),
            StatusCode::BAD_REQUEST,
            "Malformed parameter gpu: at most 65535",
        ),
    ];
    for (body, status, message) in cases {
        let r = app.post("/v1/os-hosts", body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.message().contains(message), "{body}: {}", r.message());
    }
    assert_eq!(
        app.get("/v1/os-hosts").await.body["hosts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let r = app.get("/v1/os-hosts/999").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.message(), "Object with {'host_id': '999'} not found");
    assert_eq!(
        app.get("/v1/os-hosts/abc").await.status,
        StatusCode::NOT_FOUND
    );
    // The hypervisor's id instead of its name, as Blazar takes it.
    let r = app
        .post("/v1/os-hosts", json!({"id": "compute-7", "gpu": "true"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["host"]["hypervisor_hostname"], "compute-7");
    assert_eq!(r.body["host"]["gpu"], "true");
}

#[tokio::test]
async fn update_host_capabilities_facts_and_maintenance() {
    let app = TestApp::spawn().await;
    let id = app
        .create_host("compute-2", json!({"gpu": "true", "rack": "r1"}))
        .await;
    let path = format!("/v1/os-hosts/{id}");
    let r = app
        .put(&path, json!({"rack": "r9", "owner": "team-a"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["host"]["rack"], "r9");
    assert_eq!(r.body["host"]["owner"], "team-a");
    // A null value removes a capability.
    let r = app.put(&path, json!({"owner": null})).await;
    assert!(r.body["host"].get("owner").is_none());
    // JSON booleans and numbers are kept as Blazar keeps them (on MySQL), so that the same
    // queries match the same hosts.
    let r = app
        .put(
            &path,
            json!({"flag": true, "off": false, "one": 1.0, "k": 1e3, "half": 1.5, "n": -0.0}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    for (key, text) in [
        ("flag", "1"),
        ("off", "0"),
        ("one", "1"),
        ("k", "1000"),
        ("half", "1.5"),
        ("n", "0"),
    ] {
        assert_eq!(r.body["host"][key], text, "{key}: {}", r.body);
    }
    let r = app
        .host_lease(
            "flagged",
            "2030-01-01 10:00",
            "2030-01-01 11:00",
            1,
            1,
            r#"["and", ["==", "$flag", "1"], ["==", "$off", "0"]]"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // Facts and maintenance.
    let r = app
        .put(&path, json!({"vcpus": 32, "reservable": false}))
        .await;
    assert_eq!(r.body["host"]["vcpus"], 32);
    assert_eq!(r.body["host"]["reservable"], false);
    assert!(r.body["host"]["updated_at"].is_string());

    // Blazar's whole body, its odd name included.
    let r = app.put(&path, json!({})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.body,
        json!({"error_code": 400, "error_message": "No data to update",
               "error_name": "INTERNAL_SERVER_ERROR"})
    );
    let r = app.put(&path, json!({"status": "up"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.body["error_name"], 400, "{}", r.body);
    let r = app.put("/v1/os-hosts/42", json!({"a": "b"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn maintenance_hosts_are_never_chosen() {
    let app = TestApp::spawn().await;
    let h1 = app.create_host("compute-1", json!({})).await;
    let h2 = app.create_host("compute-2", json!({})).await;
    app.put(&format!("/v1/os-hosts/{h1}"), json!({"reservable": false}))
        .await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 2, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(
        app.hosts_of(r.body["lease"]["id"].as_str().unwrap()).await,
        vec![h2.clone()]
    );
    let r = app
        .host_lease("l2", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.message().contains("1 host(s) match"), "{}", r.message());
    // The list filters on it, and a value that is neither yes nor no is refused.
    let ids = |r: &blazar_testkit::Response| -> Vec<String> {
        r.body["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&app.get("/v1/os-hosts?reservable=yes").await), vec![h2]);
    assert_eq!(
        ids(&app.get("/v1/os-hosts?reservable=false").await),
        vec![h1]
    );
    let r = app.get("/v1/os-hosts?reservable=maybe").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}

#[tokio::test]
async fn delete_host_refused_while_reserved() {
    let app = TestApp::spawn().await;
    let id = app.create_host("compute-1", json!({})).await;
    let lease = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lease_id = lease.body["lease"]["id"].as_str().unwrap().to_string();
    let r = app.delete(&format!("/v1/os-hosts/{id}")).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        r.message(),
        format!("Can't delete host {id}. The host is reserved.")
    );
    // Once the lease has ended, the host can go.
    app.tick_at(crate::harness::t(2030, 1, 1, 10, 0)).await;
    app.tick_at(crate::harness::t(2030, 1, 1, 12, 0)).await;
    assert_eq!(
        app.get(&format!("/v1/leases/{lease_id}")).await.body["lease"]["status"],
        "TERMINATED"
    );
    assert_eq!(
        app.delete(&format!("/v1/os-hosts/{id}")).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.delete(&format!("/v1/os-hosts/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn host_properties_list_detail_private() {
    let app = TestApp::spawn().await;
    app.create_host("compute-2", json!({"gpu": "true", "rack": "r1"}))
        .await;
    app.create_host("compute-3", json!({"gpu": "false", "rack": "r2"}))
        .await;
    let r = app.get("/v1/os-hosts/properties").await;
    assert_eq!(
        r.body,
        json!({"resource_properties": [{"property": "gpu"}, {"property": "rack"}]})
    );
    let r = app.get("/v1/os-hosts/properties?detail=True").await;
    assert_eq!(
        r.body["resource_properties"][0],
        json!({"property": "gpu", "private": false, "values": ["false", "true"]})
    );
    let r = app
        .patch("/v1/os-hosts/properties/rack", json!({"private": true}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let p = &r.body["resource_property"];
    assert_eq!(p["property_name"], "rack");
    assert_eq!(p["resource_type"], "physical:host");
    assert_eq!(p["private"], true);
    assert!(p["created_at"].as_str().unwrap().contains('T'));
    let hidden = app.get("/v1/os-hosts/properties?detail=True").await;
    assert_eq!(
        hidden.body["resource_properties"].as_array().unwrap().len(),
        1
    );
    let all = app
        .get("/v1/os-hosts/properties?detail=True&all=True")
        .await;
    assert_eq!(all.body["resource_properties"][1]["private"], true);

    let r = app
        .patch("/v1/os-hosts/properties/nope", json!({"private": true}))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = app
        .patch("/v1/os-hosts/properties/rack", json!({"id": "x"}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = app
        .patch("/v1/os-hosts/properties/rack", json!({"private": "maybe"}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

/// Chameleon's `is_unique`: once a property is unique, no second host or resource may take a
/// value another one holds, whichever way it is written.
#[tokio::test]
async fn unique_properties_refuse_a_second_holder() {
    let app = TestApp::spawn().await;
    let a = app
        .create_host("compute-a", json!({"node_name": "a", "rack": "r1"}))
        .await;
    app.create_host("compute-b", json!({"node_name": "b", "rack": "r1"}))
        .await;
    // Two hosts share rack r1: it cannot be made unique.
    let r = app
        .patch("/v1/os-hosts/properties/rack", json!({"is_unique": true}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.body["error_message"].as_str().unwrap().contains("r1"),
        "{}",
        r.body
    );
    let r = app
        .patch(
            "/v1/os-hosts/properties/node_name",
            json!({"is_unique": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["resource_property"]["is_unique"], true);
    assert_eq!(r.body["resource_property"]["private"], false);
    // Blazar's answers are unchanged where the flag is not set.
    let rack = app.get("/v1/os-hosts/properties?detail=True").await;
    let rack = rack.body["resource_properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["property"] == "rack")
        .cloned()
        .unwrap();
    assert!(rack.get("is_unique").is_none(), "{rack}");
    let listing = app.get("/v1/os-hosts/properties?detail=True").await;
    let node_name = listing.body["resource_properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["property"] == "node_name")
        .cloned()
        .unwrap();
    assert_eq!(node_name["is_unique"], true);
    assert_eq!(node_name["values"], json!(["a", "b"]));

    // Updating another host to a held value, or enrolling one with it, is refused whole.
    let hosts = app.get("/v1/os-hosts").await;
    let b = hosts.body["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["hypervisor_hostname"] == "compute-b")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = app
        .put(
            &format!("/v1/os-hosts/{b}"),
            json!({"node_name": "a", "rack": "r9"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.body["error_message"]
            .as_str()
            .unwrap()
            .contains("node_name"),
        "{}",
        r.body
    );
    let shown = app.get(&format!("/v1/os-hosts/{b}")).await;
    assert_eq!(shown.body["host"]["node_name"], "b");
    assert_eq!(shown.body["host"]["rack"], "r1");
    let r = app
        .post(
            "/v1/os-hosts",
            json!({"name": "compute-c", "node_name": "a"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(
        app.get("/v1/os-hosts").await.body["hosts"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // A host keeps its own value; a free value is taken.
    let r = app
        .put(&format!("/v1/os-hosts/{a}"), json!({"node_name": "a"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app
        .put(&format!("/v1/os-hosts/{b}"), json!({"node_name": "c"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // Not unique any more: values may be shared again.
    let r = app
        .patch(
            "/v1/os-hosts/properties/node_name",
            json!({"is_unique": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app
        .put(&format!("/v1/os-hosts/{b}"), json!({"node_name": "a"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    // The same holds for network segments.
    crate::inventory::segment(&app, 101, json!({"switch_port": "p1"})).await;
    let n2 = crate::inventory::segment(&app, 102, json!({"switch_port": "p2"})).await;
    let r = app
        .patch(
            "/v1/networks/properties/switch_port",
            json!({"is_unique": true, "private": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["resource_property"]["is_unique"], true);
    assert_eq!(r.body["resource_property"]["private"], true);
    let r = app
        .put(&format!("/v1/networks/{n2}"), json!({"switch_port": "p1"}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let r = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 103,
                   "switch_port": "p2"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let r = app
        .patch(
            "/v1/networks/properties/switch_port",
            json!({"is_unique": "sometimes"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    // As in Blazar: 1 and 0 are booleans, and nothing to change changes nothing.
    let path = "/v1/networks/properties/switch_port";
    let r = app.patch(path, json!({"private": 0})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["resource_property"]["private"], false);
    let r = app.patch(path, json!({"private": 1})).await;
    assert_eq!(r.body["resource_property"]["private"], true, "{}", r.body);
    let r = app.patch(path, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["resource_property"]["private"], true);
    let r = app.patch(path, json!({"private": 2})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}

#[tokio::test]
async fn capability_in_use_cannot_change() {
    let app = TestApp::spawn().await;
    let id = app
        .create_host("compute-2", json!({"gpu": "true", "rack": "r1"}))
        .await;
    let r = app
        .host_lease(
            "l",
            "2030-01-01 10:00",
            "2030-01-01 12:00",
            1,
            1,
            r#"["==", "$gpu", "true"]"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = app
        .put(&format!("/v1/os-hosts/{id}"), json!({"gpu": "false"}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    // In Blazar's words: scripts match on them.
    assert_eq!(
        r.message(),
        format!("Can't add extracapabilities ['gpu'] to Host {id}")
    );
    // One nobody filters on, or an unchanged value, goes through.
    for body in [json!({"rack": "r2"}), json!({"gpu": "true"})] {
        let r = app.put(&format!("/v1/os-hosts/{id}"), body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
}

#[tokio::test]
async fn allocations_list_every_host_and_filter() {
    let app = TestApp::spawn().await;
    let h1 = app.create_host("compute-1", json!({"gpu": "false"})).await;
    let h2 = app.create_host("compute-2", json!({"gpu": "true"})).await;
    let l1 = app
        .host_lease(
            "a",
            "2030-01-01 10:00",
            "2030-01-01 12:00",
            1,
            1,
            r#"["==", "$gpu", "true"]"#,
        )
        .await;
    let l1_id = l1.body["lease"]["id"].as_str().unwrap().to_string();
    let r1_id = l1.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let all = app.get("/v1/os-hosts/allocations").await;
    let entries = all.body["allocations"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0], json!({"resource_id": h1, "reservations": []}));
    assert_eq!(
        entries[1],
        json!({"resource_id": h2, "reservations": [{
            "id": r1_id, "lease_id": l1_id,
            "start_date": "2030-01-01T10:00:00.000000", "end_date": "2030-01-01T12:00:00.000000"}]})
    );
    let one = app.get(&format!("/v1/os-hosts/{h2}/allocation")).await;
    assert_eq!(one.body["allocation"], entries[1]);
    let by_reservation = app
        .get(&format!(
            "/v1/os-hosts/{h2}/allocation?reservation_id={r1_id}"
        ))
        .await;
    assert_eq!(by_reservation.body["allocation"], entries[1]);
    let other = app
        .get(&format!("/v1/os-hosts/{h2}/allocation?lease_id=nope"))
        .await;
    assert_eq!(other.body["allocation"]["reservations"], json!([]));
    assert_eq!(
        app.get("/v1/os-hosts/77/allocation").await.status,
        StatusCode::NOT_FOUND
    );
    // One host's allocation takes the list's window, and refuses a bad one as it does.
    let window =
        |start: &str, end: &str| format!("/v1/os-hosts/{h2}/allocation?start={start}&end={end}");
    let before = app
        .get(&window("2030-01-01%2008:00", "2030-01-01%2010:00"))
        .await;
    assert_eq!(before.status, StatusCode::OK, "{}", before.body);
    assert_eq!(before.body["allocation"]["reservations"], json!([]));
    let during = app
        .get(&window("2030-01-01%2011:00", "2030-01-01%2011:30"))
        .await;
    assert_eq!(during.body["allocation"], entries[1]);
    for bad in [
        window("bogus", "2030-01-01%2011:00"),
        window("2030-01-01%2012:00", "2030-01-01%2011:00"),
    ] {
        let r = app.get(&bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.body);
        let listed = app
            .get(&bad.replace(&format!("{h2}/allocation"), "allocations"))
            .await;
        assert_eq!(
            listed.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            listed.body
        );
    }
}

#[tokio::test]
async fn hosts_are_admin_only() {
    let mut app = TestApp::spawn().await;
    app.act_as("demo", "alice", "member");
    let r = app.get("/v1/os-hosts").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.message(),
        "Policy doesn't allow blazar:oshosts:get to be performed"
    );
    assert_eq!(
        app.post("/v1/os-hosts", json!({"name": "x"})).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.get("/v1/os-hosts/allocations").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.get("/v1/os-hosts/properties").await.status,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn an_allocation_is_over_at_its_lease_end() {
    let app = TestApp::spawn().await;
    let host = app.create_host("compute-1", json!({})).await;
    let lease = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let lease_id = lease.body["lease"]["id"].as_str().unwrap().to_string();
    let end = crate::harness::t(2030, 1, 1, 12, 0);
    let shown = |body: &serde_json::Value| {
        body["allocations"][0]["reservations"]
            .as_array()
            .unwrap()
            .len()
    };
    // Half-open windows: held until the instant before the end, free from the end on,
    // whatever fraction of a second the clock shows.
    for (at, held) in [
        (end - chrono::Duration::seconds(1), 1),
        (end - chrono::Duration::milliseconds(500), 1),
        (end, 0),
        (end + chrono::Duration::milliseconds(500), 0),
    ] {
        app.set_time(at);
        let all = app.get("/v1/os-hosts/allocations").await;
        assert_eq!(shown(&all.body), held, "at {at}: {}", all.body);
        let one = app.get(&format!("/v1/os-hosts/{host}/allocation")).await;
        assert_eq!(
            one.body["allocation"]["reservations"]
                .as_array()
                .unwrap()
                .len(),
            held,
            "at {at}: {}",
            one.body
        );
    }
    // Asking for the lease itself still shows it, as Blazar does.
    assert_eq!(app.hosts_of(&lease_id).await, vec![host]);
}

#[tokio::test]
async fn reallocation_moves_reservations_off_a_host() {
    let mut app = TestApp::spawn().await;
    let h1 = app.create_host("compute-1", json!({"rack": "a"})).await;
    let h2 = app.create_host("compute-2", json!({"rack": "a"})).await;
    let h3 = app.create_host("compute-3", json!({"rack": "b"})).await;
    app.act_as("alpha", "alice", "member");
    let rack_a = r#"["==", "$rack", "a"]"#;
    let lease = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, rack_a)
        .await;
    assert_eq!(lease.status, StatusCode::CREATED, "{}", lease.body);
    let lease_id = lease.body["lease"]["id"].as_str().unwrap().to_string();
    app.act_as_admin();
    let held = app.hosts_of(&lease_id).await;
    assert_eq!(held.len(), 1);
    let (from, to) = if held[0] == h1 {
        (&h1, &h2)
    } else {
        (&h2, &h1)
    };

    // The owner moves its own lease off the host; another project may not.
    app.act_as("beta", "bob", "member");
    let path = format!("/v1/os-hosts/{from}/allocation");
    let r = app.put(&path, json!({"lease_id": lease_id})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    let r = app.put(&path, json!({})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    app.act_as("alpha", "alice", "member");
    let r = app.put(&path, json!({"lease_id": lease_id})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.body,
        json!({"allocation": {"resource_id": from, "reservations": []}})
    );
    app.act_as_admin();
    assert_eq!(app.hosts_of(&lease_id).await, vec![to.clone()]);
    let shown = app.get(&format!("/v1/leases/{lease_id}")).await;
    assert_eq!(
        shown.body["lease"]["reservations"][0]["resources_changed"],
        true
    );
    assert_eq!(shown.body["lease"]["degraded"], false);

    // Another lease takes the freed host; then no other host matches: the reservation keeps
    // its host (taking it away would only have healing hand it back) and the caller is told.
    let other = app
        .host_lease("b", "2030-01-01 09:00", "2030-01-01 13:00", 1, 1, rack_a)
        .await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.body);
    let before = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    let r = app
        .put(
            &format!("/v1/os-hosts/{to}/allocation"),
            json!({"lease_id": lease_id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let reservation = before["lease"]["reservations"][0]["id"].as_str().unwrap();
    assert_eq!(
        r.body["error_message"],
        format!(
            "No other host matching reservation {reservation} is free for the rest of its \
             lease; it keeps host {to}"
        )
    );
    let shown = app.get(&format!("/v1/leases/{lease_id}")).await;
    assert_eq!(shown.body, before, "nothing changed");
    assert_eq!(app.hosts_of(&lease_id).await, vec![to.clone()]);
    // The host of another rack was never a candidate.
    let r = app.get(&format!("/v1/os-hosts/{h3}/allocation")).await;
    assert_eq!(r.body["allocation"]["reservations"], json!([]));

    // Bad requests.
    for (path, body, status) in [
        (
            "/v1/os-hosts/999/allocation",
            json!({}),
            StatusCode::NOT_FOUND,
        ),
        (
            "/v1/os-hosts/1/allocation",
            json!({"lease": "x"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/os-hosts/1/allocation",
            json!({"lease_id": 7}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/os-hosts/1/allocation",
            json!({"lease_id": "no-such-lease"}),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let r = app.put(path, body.clone()).await;
        assert_eq!(r.status, status, "{path} {body}: {}", r.body);
    }
}

/// The streamed list sizes its batches by how many allocations the last one held, so that
/// what a reader holds in memory stays small however dense the allocations are: with a
/// target of one allocation a batch, the first batch of 250 hosts (250 allocations) is
/// followed by batches of one host each. The answer is the same whole list, in order.
#[tokio::test]
async fn allocation_lists_shrink_their_batches_where_allocations_are_dense() {
    let app = TestApp::spawn_with(blazar_service::Settings {
        list_batch_allocations: 1,
        ..blazar_service::Settings::default()
    })
    .await;
    let mut hosts = Vec::new();
    for i in 0..300 {
        hosts.push(
            app.create_host(&format!("compute-{i:03}"), json!({"n": i}))
                .await,
        );
    }
    let mut leases = Vec::new();
    for i in 0..300 {
        let r = app
            .host_lease(
                &format!("l{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                1,
                1,
                &format!(r#"["==", "$n", "{i}"]"#),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        leases.push(r.body["lease"]["id"].as_str().unwrap().to_string());
    }
    let all = app.get("/v1/os-hosts/allocations").await;
    assert_eq!(all.status, StatusCode::OK);
    let entries = all.body["allocations"].as_array().unwrap();
    let seen: Vec<(&str, Vec<&str>)> = entries
        .iter()
        .map(|e| {
            let held = e["reservations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["lease_id"].as_str().unwrap())
                .collect();
            (e["resource_id"].as_str().unwrap(), held)
        })
        .collect();
    let expected: Vec<(&str, Vec<&str>)> = hosts
        .iter()
        .zip(&leases)
        .map(|(host, lease)| (host.as_str(), vec![lease.as_str()]))
        .collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn allocation_lists_page_and_filter_by_window_across_batches() {
    let app = TestApp::spawn().await;
    // More hosts than one batch of the streamed list reads, so that the answer is written
    // in several parts; one lease per host, every third one in the past.
    let mut hosts = Vec::new();
    for i in 0..600 {
        hosts.push(
            app.create_host(&format!("compute-{i:03}"), json!({"n": i}))
                .await,
        );
    }
    app.set_time(crate::harness::t(2029, 12, 1, 0, 0));
    for (i, host) in hosts.iter().enumerate() {
        let day = if i % 3 == 0 { 2 } else { 20 };
        let r = app
            .host_lease(
                &format!("l{i}"),
                &format!("2029-12-{day:02} 10:00"),
                &format!("2029-12-{day:02} 12:00"),
                1,
                1,
                &format!(r#"["==", "$n", "{i}"]"#),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{host}: {}", r.body);
    }
    app.set_time(crate::harness::t(2029, 12, 10, 0, 0));
    let held = |body: &serde_json::Value| -> usize {
        body["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["reservations"].as_array().unwrap().len())
            .sum()
    };

    // Blazar's list: every host, in id order, with leases that have not ended.
    let all = app.get("/v1/os-hosts/allocations").await;
    assert_eq!(all.status, StatusCode::OK);
    let entries = all.body["allocations"].as_array().unwrap();
    assert_eq!(entries.len(), 600);
    let ids: Vec<&str> = entries
        .iter()
        .map(|e| e["resource_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, hosts.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(held(&all.body), 400);
    assert!(all.body.get("next_marker").is_none());

    // A window shows what overlaps it, ended leases included.
    let early = app
        .get("/v1/os-hosts/allocations?start=2029-12-02 11:00&end=2029-12-03 00:00")
        .await;
    assert_eq!(held(&early.body), 200, "{}", early.body);
    let both = app
        .get("/v1/os-hosts/allocations?start=2029-12-01 00:00&end=2030-01-01 00:00")
        .await;
    assert_eq!(held(&both.body), 600);
    let touching = app
        .get("/v1/os-hosts/allocations?start=2029-12-02 12:00&end=2029-12-20 10:00")
        .await;
    assert_eq!(held(&touching.body), 0, "half-open windows do not meet");
    // A page of a window: its hosts only, with what they held in it (every third lease
    // is on the 2nd), none of the hosts before the marker or after the limit.
    let page = app
        .get(&format!(
            "/v1/os-hosts/allocations?start=2029-12-02 11:00&end=2029-12-03 00:00\
             &limit=250&marker={}",
            hosts[299]
        ))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let listed: Vec<&str> = page.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["resource_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        hosts[300..550]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    assert_eq!(held(&page.body), (300..550).filter(|i| i % 3 == 0).count());
    assert_eq!(page.body["next_marker"].as_str(), Some(hosts[549].as_str()));

    // Pages of hosts: limit and marker, and the marker of the next page in the answer.
    let mut seen = Vec::new();
    let mut path = "/v1/os-hosts/allocations?limit=250".to_string();
    loop {
        let page = app.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        for e in page.body["allocations"].as_array().unwrap() {
            seen.push(e["resource_id"].as_str().unwrap().to_string());
        }
        match page.body["next_marker"].as_str() {
            Some(marker) => {
                assert_eq!(Some(marker), seen.last().map(String::as_str));
                path = format!("/v1/os-hosts/allocations?limit=250&marker={marker}");
            }
            None => break,
        }
    }
    assert_eq!(seen, hosts);
    let lease_filter = app
        .get(&format!(
            "/v1/os-hosts/allocations?limit=3&lease_id={}",
            app.get("/v1/leases").await.body["leases"][0]["id"]
                .as_str()
                .unwrap()
        ))
        .await;
    assert_eq!(
        lease_filter.body["allocations"].as_array().unwrap().len(),
        3
    );

    for (query, message) in [
        ("limit=0", "Malformed parameter limit"),
        ("limit=x", "Malformed parameter limit"),
        ("marker=999999", "Marker 999999 not found"),
        ("start=yesterday", "is an invalid start date"),
        (
            "start=2029-12-03 00:00&end=2029-12-02 00:00",
            "must be later than start",
        ),
    ] {
        let r = app.get(&format!("/v1/os-hosts/allocations?{query}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}: {}", r.body);
        assert!(r.message().contains(message), "{query}: {}", r.body);
    }
}

#[tokio::test]
async fn pool_allocation_lists_page_too() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let r = app
            .post(
                "/v1/floatingips",
                json!({"floating_network_id": "net-1",
                       "floating_ip_address": format!("10.0.0.{}", i + 10)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        ids.push(r.body["floatingip"]["id"].as_str().unwrap().to_string());
    }
    let first = app.get("/v1/floatingips/allocations?limit=2").await;
    let listed: Vec<&str> = first.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["resource_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[0].as_str(), ids[1].as_str()]);
    assert_eq!(first.body["next_marker"], ids[1].as_str());
    let rest = app
        .get(&format!("/v1/floatingips/allocations?marker={}", ids[1]))
        .await;
    assert_eq!(rest.body["allocations"].as_array().unwrap().len(), 3);
    assert!(rest.body.get("next_marker").is_none());
}

/// As Blazar, a member is told about `oshosts:get` for one host's update, delete and
/// allocation (Blazar looks the host up under that rule first), also when the allocation
/// read's parameters are bad, and a floating IP that does
/// not exist is a 404 to a member, who may read floating IPs, before any 403 for deleting.
#[tokio::test]
async fn single_resource_changes_check_the_read_rule_first() {
    let mut app = TestApp::spawn().await;
    let id = app.create_host("compute-1", json!({})).await;
    app.act_as("alpha", "ada", "member");
    let path = format!("/v1/os-hosts/{id}");
    for r in [
        app.put(&path, json!({"rack": "r1"})).await,
        app.delete(&path).await,
        app.get(&format!("{path}/allocation")).await,
        app.get(&format!("{path}/allocation?start=yesterday")).await,
    ] {
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert_eq!(
            r.message(),
            "Policy doesn't allow blazar:oshosts:get to be performed"
        );
    }
    // The rule comes before the parameters, as in Blazar, which reads them after it.
    let r = app.get("/v1/os-hosts/allocations?limit=0").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        r.message(),
        "Policy doesn't allow blazar:oshosts:get_allocations to be performed"
    );
    let r = app
        .delete("/v1/floatingips/00000000-0000-0000-0000-000000000000")
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
}
