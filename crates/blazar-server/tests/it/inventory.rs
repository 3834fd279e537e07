//! Floating IPs, network segments, devices and flavors: inventory endpoints and their
//! reservations.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestApp, t};

pub async fn fip(app: &TestApp, network: &str, address: &str) -> String {
    let r = app
        .post(
            "/v1/floatingips",
            json!({"floating_network_id": network, "floating_ip_address": address}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["floatingip"]["id"].as_str().unwrap().to_string()
}

pub async fn segment(app: &TestApp, vlan: i64, extra: Value) -> String {
    let mut body =
        json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": vlan});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let r = app.post("/v1/networks", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["network"]["id"].as_str().unwrap().to_string()
}

pub async fn device(app: &TestApp, name: &str, extra: Value) -> String {
    let mut body = json!({"name": name, "device_type": "gpu", "device_driver": "k8s"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let r = app.post("/v1/devices", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["device"]["id"].as_str().unwrap().to_string()
}

fn lease(name: &str, start: &str, end: &str, reservations: Value) -> Value {
    json!({"name": name, "start_date": start, "end_date": end, "events": [], "reservations": reservations})
}

#[tokio::test]
async fn floating_ip_inventory() {
    let app = TestApp::spawn().await;
    let r = app
        .post(
            "/v1/floatingips",
            json!({"floating_network_id": "net-1", "floating_ip_address": "172.24.4.101"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let f = &r.body["floatingip"];
    let keys: Vec<&str> = f.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "id",
            "floating_network_id",
            "subnet_id",
            "floating_ip_address",
            "reservable",
            "created_at",
            "updated_at"
        ]
    );
    assert!(
        f["created_at"].as_str().unwrap().contains('T'),
        "create answers raw timestamps"
    );
    let id = f["id"].as_str().unwrap();
    let cases = [
        (
            json!({"floating_network_id": "net-1"}),
            StatusCode::BAD_REQUEST,
            "Missing parameter floating_ip_address",
        ),
        (
            json!({}),
            StatusCode::BAD_REQUEST,
            "Missing parameter floating_network_id,floating_ip_address",
        ),
        (
            json!({"floating_network_id": "net-1", "floating_ip_address": "300.1.1.1"}),
            StatusCode::BAD_REQUEST,
            "IP address 300.1.1.1 is invalid form.",
        ),
        (
            json!({"floating_network_id": "net-1", "floating_ip_address": "0.0.0.0"}),
            StatusCode::BAD_REQUEST,
            "IP address 0.0.0.0 cannot be a floating IP",
        ),
        (
            json!({"floating_network_id": "net-1", "floating_ip_address": "::"}),
            StatusCode::BAD_REQUEST,
            "cannot be a floating IP",
        ),
        (
            json!({"floating_network_id": "net-1", "floating_ip_address": "255.255.255.255"}),
            StatusCode::BAD_REQUEST,
            "cannot be a floating IP",
        ),
        (
            json!({"floating_network_id": "net-1", "floating_ip_address": "ff02::1"}),
            StatusCode::BAD_REQUEST,
            "cannot be a floating IP",
        ),
        // A network a reservation could not name.
        (
            json!({"floating_network_id": "net\u{1}", "floating_ip_address": "172.24.4.9"}),
            StatusCode::BAD_REQUEST,
            "control characters are not allowed",
        ),
        (
            json!({"floating_network_id": "net-1", "floating_ip_address": "172.24.4.101"}),
            StatusCode::CONFLICT,
            "already registered",
        ),
        // The same address as an IPv4-mapped IPv6 address is the same floating IP.
        (
            json!({"floating_network_id": "net-1", "floating_ip_address": "::ffff:172.24.4.101"}),
            StatusCode::CONFLICT,
            "already registered",
        ),
        (
            json!({"floating_network_id": "net-1", "floating_ip_address": "172.24.4.102", "colour": "red"}),
            StatusCode::BAD_REQUEST,
            "Unknown field colour",
        ),
    ];
    for (body, status, message) in cases {
        let r = app.post("/v1/floatingips", body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.message().contains(message), "{body}: {}", r.message());
    }
    let listed = app.get("/v1/floatingips").await;
    assert_eq!(listed.body["floatingips"].as_array().unwrap().len(), 1);
    let shown = app.get(&format!("/v1/floatingips/{id}")).await;
    assert_eq!(
        shown.body["floatingip"]["floating_ip_address"],
        "172.24.4.101"
    );
    assert!(
        !shown.body["floatingip"]["created_at"]
            .as_str()
            .unwrap()
            .contains('T')
    );
    let missing = app.get("/v1/floatingips/nope").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.message(), "Floating IP nope not found.");
    // Readers may list floating IPs; only admins register them.
    let mut member = TestApp::spawn().await;
    member.act_as("demo", "alice", "reader");
    assert_eq!(member.get("/v1/floatingips").await.status, StatusCode::OK);
    assert_eq!(
        member
            .post(
                "/v1/floatingips",
                json!({"floating_network_id": "n", "floating_ip_address": "10.0.0.1"})
            )
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.delete(&format!("/v1/floatingips/{id}")).await.status,
        StatusCode::NO_CONTENT
    );
}

/// Two floating IPs of `net-1`, one of them `172.24.4.101` by name.
fn one_named_address_of_two() -> Value {
    json!([{"resource_type": "virtual:floatingip", "network_id": "net-1",
            "amount": 2, "required_floatingips": ["172.24.4.101"]}])
}

/// A lease update of a floating-IP reservation keeps the address it requires and the one it
/// was given besides: the required address, held as well, is one candidate, not two (it
/// once counted twice, and the update was refused for want of a second address).
#[tokio::test]
async fn an_update_keeps_a_required_address_and_the_other_it_holds() {
    let app = TestApp::spawn().await;
    fip(&app, "net-1", "172.24.4.101").await;
    fip(&app, "net-1", "172.24.4.102").await;
    let created = app
        .post(
            "/v1/leases",
            lease(
                "pair",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                one_named_address_of_two(),
            ),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let id = created.body["lease"]["id"].as_str().unwrap();
    let updated = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-01 13:00"}),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    assert_eq!(
        updated.body["lease"]["end_date"],
        "2030-01-01T13:00:00.000000"
    );
}

/// A required floating IP is the address its user named: when it goes out of service the
/// reservation waits for it, flagged, rather than take another; an address it was given
/// besides is replaced as any resource is; the named one comes back to it.
#[tokio::test]
async fn a_required_address_out_of_service_is_waited_for_not_replaced() {
    let app = TestApp::spawn().await;
    let named = fip(&app, "net-1", "172.24.4.101").await;
    let second = fip(&app, "net-1", "172.24.4.102").await;
    let third = fip(&app, "net-1", "172.24.4.103").await;
    let created = app
        .post(
            "/v1/leases",
            lease(
                "named",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                one_named_address_of_two(),
            ),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let id = created.body["lease"]["id"].as_str().unwrap().to_string();
    let before = held_addresses(&app).await;
    assert!(before.contains(&"172.24.4.101".to_string()), "{before:?}");
    let other = before
        .iter()
        .find(|a| *a != "172.24.4.101")
        .unwrap()
        .clone();
    // The named address goes out of service: not replaced, the lease degraded.
    set_reservable(&app, &named, false).await;
    assert_eq!(held_addresses(&app).await, vec![other.clone()]);
    assert_eq!(flags(&app, &id).await, (json!(true), json!(true)));
    // It comes back: the reservation holds it again, whole.
    set_reservable(&app, &named, true).await;
    assert_eq!(
        held_addresses(&app).await,
        vec!["172.24.4.101".to_string(), other.clone()]
    );
    assert_eq!(flags(&app, &id).await, (json!(false), json!(false)));
    // The address given besides goes: the remaining one takes its place.
    let (other_id, rest) = if other == "172.24.4.102" {
        (&second, "172.24.4.103")
    } else {
        (&third, "172.24.4.102")
    };
    set_reservable(&app, other_id, false).await;
    assert_eq!(
        held_addresses(&app).await,
        vec!["172.24.4.101".to_string(), rest.to_string()]
    );
    assert_eq!(flags(&app, &id).await, (json!(false), json!(false)));
}

/// Puts floating IP `id` in or out of service, as an operator does.
async fn set_reservable(app: &TestApp, id: &str, reservable: bool) {
    let r = app
        .put(
            &format!("/v1/floatingips/{id}"),
            json!({ "reservable": reservable }),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// The floating IPs some lease holds, by address.
async fn held_addresses(app: &TestApp) -> Vec<String> {
    let listed = app.get("/v1/floatingips/allocations").await.body;
    let mut shown = Vec::new();
    for a in listed["allocations"].as_array().unwrap() {
        if a["reservations"] == json!([]) {
            continue;
        }
        let fid = a["resource_id"].as_str().unwrap();
        let f = app.get(&format!("/v1/floatingips/{fid}")).await.body;
        shown.push(
            f["floatingip"]["floating_ip_address"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    shown.sort();
    shown
}

/// A lease's `degraded` and its first reservation's `missing_resources`.
async fn flags(app: &TestApp, id: &str) -> (Value, Value) {
    let l = app.get(&format!("/v1/leases/{id}")).await.body;
    (
        l["lease"]["degraded"].clone(),
        l["lease"]["reservations"][0]["missing_resources"].clone(),
    )
}

#[tokio::test]
async fn floating_ip_reservations() {
    let app = TestApp::spawn().await;
    let a = fip(&app, "net-1", "172.24.4.101").await;
    let _b = fip(&app, "net-1", "172.24.4.102").await;
    fip(&app, "net-2", "10.0.0.5").await;
    let fip_res = |amount: i64, required: Value| json!([{"resource_type": "virtual:floatingip", "network_id": "net-1", "amount": amount, "required_floatingips": required}]);
    let one = app
        .post(
            "/v1/leases",
            lease(
                "one",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                fip_res(1, json!(["172.24.4.102"])),
            ),
        )
        .await;
    assert_eq!(one.status, StatusCode::CREATED, "{}", one.body);
    let res = &one.body["lease"]["reservations"][0];
    assert_eq!(res["network_id"], "net-1");
    assert_eq!(res["amount"], 1);
    assert_eq!(res["required_floatingips"], json!(["172.24.4.102"]));
    // An integer-like string is taken and stored as an integer.
    let string_amount = app
        .post(
            "/v1/leases",
            lease(
                "string-amount",
                "2030-02-01 10:00",
                "2030-02-01 12:00",
                json!([{"resource_type": "virtual:floatingip", "network_id": "net-1",
                        "amount": "1", "required_floatingips": []}]),
            ),
        )
        .await;
    assert_eq!(
        string_amount.status,
        StatusCode::CREATED,
        "{}",
        string_amount.body
    );
    assert_eq!(
        string_amount.body["lease"]["reservations"][0]["amount"],
        json!(1)
    );
    let two = app
        .post(
            "/v1/leases",
            lease(
                "two",
                "2030-01-01 11:00",
                "2030-01-01 13:00",
                fip_res(1, json!([])),
            ),
        )
        .await;
    assert_eq!(two.status, StatusCode::CREATED, "{}", two.body);
    let three = app
        .post(
            "/v1/leases",
            lease(
                "three",
                "2030-01-01 11:00",
                "2030-01-01 13:00",
                fip_res(1, json!([])),
            ),
        )
        .await;
    assert_eq!(three.status, StatusCode::BAD_REQUEST);
    assert!(
        three
            .message()
            .contains("Not enough floating IPs available"),
        "{}",
        three.message()
    );
    let bad = [
        (
            fip_res(1, json!(["172.24.4.101", "172.24.4.102"])),
            StatusCode::BAD_REQUEST,
            "Invalid values for required_floatingips and amount",
        ),
        (
            fip_res(1, json!(["nonsense"])),
            StatusCode::BAD_REQUEST,
            "is invalid form",
        ),
        (
            fip_res(0, json!([])),
            StatusCode::BAD_REQUEST,
            "Malformed parameter amount",
        ),
        (
            fip_res(1, json!(["10.0.0.5"])),
            StatusCode::BAD_REQUEST,
            "not a reservable floating IP of network net-1",
        ),
        (
            json!([{"resource_type": "virtual:floatingip", "amount": 1}]),
            StatusCode::BAD_REQUEST,
            "Missing parameter network_id",
        ),
    ];
    for (reservations, status, message) in bad {
        let r = app
            .post(
                "/v1/leases",
                lease(
                    "bad",
                    "2030-02-01 10:00",
                    "2030-02-01 12:00",
                    reservations.clone(),
                ),
            )
            .await;
        assert_eq!(r.status, status, "{reservations}: {}", r.body);
        assert!(
            r.message().contains(message),
            "{reservations}: {}",
            r.message()
        );
    }
    // Allocations per floating IP; a reserved one cannot be deleted.
    let allocations = app.get("/v1/floatingips/allocations").await;
    assert_eq!(allocations.body["allocations"].as_array().unwrap().len(), 3);
    let r = app.delete(&format!("/v1/floatingips/{a}")).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(r.message().starts_with("Can't delete floating IP"));
    // At start the address is handed to the project; at end it returns.
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let held = app
        .get("/v1/handovers?resource_type=virtual:floatingip")
        .await
        .body["handovers"]
        .clone();
    assert_eq!(held.as_array().unwrap().len(), 1, "{held}");
    assert_eq!(held[0]["lease_id"], one.body["lease"]["id"]);
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    let held = app
        .get("/v1/handovers?resource_type=virtual:floatingip")
        .await
        .body["handovers"]
        .clone();
    assert_eq!(
        held.as_array().unwrap().len(),
        1,
        "lease two holds its address until 13:00: {held}"
    );
    app.tick_at(t(2030, 1, 1, 13, 0)).await;
    assert_eq!(
        app.get("/v1/handovers").await.body["handovers"],
        json!([]),
        "every address returned"
    );
}

/// An active floating-IP reservation may take more addresses but give none back: Blazar's
/// 400, and nothing changes.
#[tokio::test]
async fn an_active_floating_ip_reservation_gives_no_address_back() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for last in 101..=103 {
        ids.push(fip(&app, "net-1", &format!("172.24.4.{last}")).await);
    }
    let r = app
        .post(
            "/v1/leases",
            lease(
                "held",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([{"resource_type": "virtual:floatingip", "network_id": "net-1",
                        "amount": 2}]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let rid = r.body["lease"]["reservations"][0]["id"].clone();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let before = app.get("/v1/floatingips/allocations").await.body;
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"reservations": [{"id": rid, "amount": 1}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(
        r.message()
            .starts_with("Cannot remove allocations from an active reservation"),
        "{}",
        r.message()
    );
    // Which address it would give back, by the address (not an internal number).
    assert!(
        r.message()
            .contains("would give back floating IP(s) 172.24.4.10"),
        "{}",
        r.message()
    );
    assert_eq!(r.body["reasons"][0]["resource_type"], "virtual:floatingip");
    assert_eq!(app.get("/v1/floatingips/allocations").await.body, before);
    let lease = app.get(&format!("/v1/leases/{id}")).await.body;
    assert_eq!(lease["lease"]["status"], "ACTIVE");
    assert_eq!(lease["lease"]["reservations"][0]["amount"], 2);
    // Growing is accepted, and the new address is handed over at once.
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"reservations": [{"id": rid, "amount": 3}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let held = app
        .get("/v1/handovers?resource_type=virtual:floatingip")
        .await
        .body["handovers"]
        .clone();
    assert_eq!(held.as_array().unwrap().len(), 3, "{held}");
    // Each hand-over names its address by the id the floating IP API shows.
    let mut shown: Vec<String> = held
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["resource_id"].as_str().unwrap().to_string())
        .collect();
    shown.sort();
    ids.sort();
    assert_eq!(shown, ids, "{held}");
}

/// An active device reservation cut from two devices to one is refused, naming the device
/// it would lose by the id the device API shows.
#[tokio::test]
async fn an_active_device_reservation_names_what_it_would_lose_by_its_api_id() {
    let app = TestApp::spawn().await;
    let ids = [
        device(&app, "gpu-a", json!({})).await,
        device(&app, "gpu-b", json!({})).await,
    ];
    let r = app
        .post(
            "/v1/leases",
            lease(
                "held",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([{"resource_type": "device", "min": 2, "max": 2,
                        "resource_properties": ""}]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let rid = r.body["lease"]["reservations"][0]["id"].clone();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"reservations": [{"id": rid, "min": 1, "max": 1}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let lost = r
        .message()
        .split("would lose resource(s) ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_default()
        .to_string();
    assert!(ids.contains(&lost), "{}", r.message());
    // Blazar's words first, then the reservation by its id, as the reasons name it in an
    // update.
    let rid = rid.as_str().unwrap();
    assert!(
        r.message().starts_with(&format!(
            "Not enough devices available: reservation {rid} is active"
        )),
        "{}",
        r.message()
    );
    assert_eq!(r.body["reasons"][0]["reservation"], rid, "{}", r.body);
}

/// Many deletes of one thing at once: one of them deletes it (204), the others find it gone
/// (404), on every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_deletes_of_one_thing_succeed_once() {
    let app = TestApp::spawn().await;
    for round in 0..3 {
        let paths = [
            format!(
                "/v1/floatingips/{}",
                fip(&app, "net-1", &format!("172.24.4.{}", 10 + round)).await
            ),
            format!(
                "/v1/networks/{}",
                segment(&app, 100 + round, json!({})).await
            ),
            format!(
                "/v1/devices/{}",
                device(&app, &format!("gpu-{round}"), json!({})).await
            ),
            {
                let r = app
                    .post(
                        "/v1/webhooks",
                        json!({"url": format!("http://127.0.0.1:9/{round}")}),
                    )
                    .await;
                assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
                format!("/v1/webhooks/{}", r.body["webhook"]["id"].as_str().unwrap())
            },
        ];
        for path in paths {
            let answers = futures::future::join_all((0..16).map(|_| app.delete(&path))).await;
            let deleted = answers
                .iter()
                .filter(|r| r.status == StatusCode::NO_CONTENT)
                .count();
            assert_eq!(deleted, 1, "{path}");
            for r in &answers {
                assert!(
                    [StatusCode::NO_CONTENT, StatusCode::NOT_FOUND].contains(&r.status),
                    "{path}: {}",
                    r.body
                );
            }
        }
    }
}

#[tokio::test]
async fn network_segments() {
    let app = TestApp::spawn().await;
    let n1 = segment(&app, 100, json!({"tier": "gold"})).await;
    segment(&app, 101, json!({"tier": "silver"})).await;
    let shown = app.get(&format!("/v1/networks/{n1}")).await;
    assert_eq!(shown.body["network"]["segment_id"], 100);
    assert_eq!(shown.body["network"]["tier"], "gold");
    let dup = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 100}),
        )
        .await;
    assert_eq!(dup.status, StatusCode::CONFLICT, "{}", dup.body);
    let out_of_range = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 5000}),
        )
        .await;
    assert_eq!(out_of_range.status, StatusCode::BAD_REQUEST);
    let other_physnet = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet2", "segment_id": 100}),
        )
        .await;
    assert_eq!(
        other_physnet.status,
        StatusCode::CREATED,
        "VLAN ids are unique per physical network"
    );
    let props = app.get("/v1/networks/properties?detail=True").await;
    assert_eq!(props.body["resource_properties"][0]["property"], "tier");

    let net = |name: &str, props: &str| json!([{"resource_type": "network", "network_name": name, "resource_properties": props}]);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "n",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                net("my-net", r#"["==", "$tier", "gold"]"#),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["reservations"][0]["network_name"], "my-net");
    let lid = r.body["lease"]["id"].as_str().unwrap();
    let mine = app
        .get(&format!("/v1/networks/allocations?lease_id={lid}"))
        .await;
    let granted: Vec<&Value> = mine.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != json!([]))
        .collect();
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0]["resource_id"], n1.as_str());
    let r = app
        .post(
            "/v1/leases",
            lease(
                "n2",
                "2030-01-01 11:00",
                "2030-01-01 12:00",
                net("x", r#"["==", "$tier", "gold"]"#),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "n3",
                "2030-01-01 11:00",
                "2030-01-01 12:00",
                json!([{"resource_type": "network"}]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.message().contains("Missing parameter network_name"));
    assert_eq!(
        app.delete(&format!("/v1/networks/{n1}")).await.status,
        StatusCode::CONFLICT
    );
    // Chameleon's network_properties: a second query on the segment, ANDed with
    // resource_properties. Only the physnet2 segment (VLAN 100, no tier) is on physnet2.
    let both = |network: &str, resource: &str| {
        json!([{"resource_type": "network", "network_name": "p2",
            "network_properties": network, "resource_properties": resource}])
    };
    let r = app
        .post(
            "/v1/leases",
            lease(
                "p2",
                "2030-01-02 10:00",
                "2030-01-02 12:00",
                both(r#"["==", "$physical_network", "physnet2"]"#, ""),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let res = &r.body["lease"]["reservations"][0];
    assert_eq!(
        res["network_properties"],
        r#"["==", "$physical_network", "physnet2"]"#
    );
    let lid = r.body["lease"]["id"].as_str().unwrap();
    let mine = app
        .get(&format!("/v1/networks/allocations?lease_id={lid}"))
        .await;
    let granted: Vec<&Value> = mine.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != json!([]))
        .collect();
    assert_eq!(granted.len(), 1);
    assert_eq!(
        granted[0]["resource_id"],
        other_physnet.body["network"]["id"]
    );
    // Both queries must hold: no physnet2 segment is gold.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "p2-gold",
                "2030-01-03 10:00",
                "2030-01-03 12:00",
                both(
                    r#"["==", "$physical_network", "physnet2"]"#,
                    r#"["==", "$tier", "gold"]"#,
                ),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "p-bad",
                "2030-01-03 10:00",
                "2030-01-03 12:00",
                both("[\"==\", \"$physical_network\"", ""),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.message().contains("network_properties"), "{}", r.body);
}

#[tokio::test]
async fn devices() {
    let app = TestApp::spawn().await;
    device(
        &app,
        "gpu-a100-1",
        json!({"gpu_model": "A100", "vendor_id": "10de"}),
    )
    .await;
    device(&app, "gpu-a100-2", json!({"gpu_model": "A100"})).await;
    device(&app, "gpu-v100-1", json!({"gpu_model": "V100"})).await;
    let dup = app.post("/v1/devices", json!({"name": "gpu-a100-1"})).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    let listed = app.get("/v1/devices").await;
    assert_eq!(listed.body["devices"].as_array().unwrap().len(), 3);
    assert_eq!(listed.body["devices"][0]["gpu_model"], "A100");
    assert_eq!(listed.body["devices"][0]["vendor_id"], "10de");
    let dev = |min: i64, max: i64, props: &str| json!([{"resource_type": "device", "min": min, "max": max, "resource_properties": props}]);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "d",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                dev(1, 5, r#"["==", "$gpu_model", "A100"]"#),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lid = r.body["lease"]["id"].as_str().unwrap();
    let mine = app
        .get(&format!("/v1/devices/allocations?lease_id={lid}"))
        .await;
    let granted = mine.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != json!([]))
        .count();
    assert_eq!(granted, 2, "greedy toward max among the A100s");
    let r = app
        .post(
            "/v1/leases",
            lease(
                "d2",
                "2030-01-01 11:00",
                "2030-01-01 12:00",
                dev(1, 1, r#"["==", "$gpu_model", "A100"]"#),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(
        r.message().contains("2 match the request"),
        "{}",
        r.message()
    );
    let r = app
        .post(
            "/v1/leases",
            lease(
                "d3",
                "2030-01-01 11:00",
                "2030-01-01 12:00",
                dev(1, 1, r#"["==", "$colour", "red"]"#),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn flavors() {
    let app = TestApp::spawn().await;
    let r = app
        .post("/v1/flavors", json!({"name": "m1.small", "vcpus": 2, "ram": 4096, "disk": 20, "extra_specs": {"hw:cpu_policy": "shared"}}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["flavor"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        app.get("/v1/flavors").await.body["flavors"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        app.get("/v1/flavors/m1.small").await.body["flavor"]["id"],
        id.as_str()
    );
    assert_eq!(
        app.post(
            "/v1/flavors",
            json!({"name": "m1.small", "vcpus": 1, "ram": 1})
        )
        .await
        .status,
        StatusCode::CONFLICT
    );
    assert_eq!(
        app.post("/v1/flavors", json!({"name": "x", "vcpus": 0, "ram": 1}))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        app.delete(&format!("/v1/flavors/{id}")).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.get(&format!("/v1/flavors/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn unknown_property_messages_never_name_private_properties() {
    let mut app = TestApp::spawn().await;
    app.create_host("c1", json!({"gpu": "true", "secret_rack": "r7"}))
        .await;
    segment(&app, 100, json!({"secret_net": "x", "zone": "a"})).await;
    device(&app, "d1", json!({"secret_dev": "y", "vendor": "v"})).await;
    for (path, name) in [
        ("/v1/os-hosts/properties/secret_rack", "secret_rack"),
        ("/v1/networks/properties/secret_net", "secret_net"),
        ("/v1/devices/properties/secret_dev", "secret_dev"),
    ] {
        let r = app.patch(path, json!({"private": true})).await;
        assert_eq!(r.status, StatusCode::OK, "{name}: {}", r.body);
    }
    let cases = [
        (
            json!([{"resource_type": "physical:host", "min": 1, "max": 1,
                    "hypervisor_properties": "", "resource_properties": "[\"==\", \"$nope\", \"1\"]"}]),
            ["secret_rack", "gpu"],
        ),
        (
            json!([{"resource_type": "network", "network_name": "n",
                    "resource_properties": "[\"==\", \"$nope\", \"1\"]"}]),
            ["secret_net", "zone"],
        ),
        (
            json!([{"resource_type": "device", "min": 1, "max": 1,
                    "resource_properties": "[\"==\", \"$nope\", \"1\"]"}]),
            ["secret_dev", "vendor"],
        ),
    ];
    for roles in ["member", "admin"] {
        if roles == "admin" {
            app.act_as_admin();
        } else {
            app.act_as("demo", "alice", "member");
        }
        for (reservations, [private, public]) in &cases {
            let r = app
                .post(
                    "/v1/leases",
                    lease(
                        "l",
                        "2030-01-01 10:00",
                        "2030-01-01 12:00",
                        reservations.clone(),
                    ),
                )
                .await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
            let message = r.message();
            assert!(message.contains("Unknown property $nope"), "{message}");
            assert!(message.contains(public), "{roles}: {message}");
            assert!(!message.contains(private), "{roles}: {message}");
        }
    }
}

#[tokio::test]
async fn reallocation_moves_reservations_off_a_device() {
    let app = TestApp::spawn().await;
    let d1 = device(&app, "edge-1", json!({"model": "x"})).await;
    let d2 = device(&app, "edge-2", json!({"model": "x"})).await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "d",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([{"resource_type": "device", "min": 1, "max": 1,
                        "resource_properties": "[\"==\", \"$model\", \"x\"]"}]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let holder = |body: &Value| -> Vec<String> {
        body["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["reservations"] != json!([]))
            .map(|a| a["resource_id"].as_str().unwrap().to_string())
            .collect()
    };
    let before = holder(&app.get("/v1/devices/allocations").await.body);
    assert_eq!(before.len(), 1);
    let (from, to) = if before[0] == d1 {
        (&d1, &d2)
    } else {
        (&d2, &d1)
    };
    let r = app
        .put(
            &format!("/v1/devices/{from}/allocation"),
            json!({"lease_id": lease_id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["allocation"]["reservations"], json!([]));
    assert_eq!(
        holder(&app.get("/v1/devices/allocations").await.body),
        vec![to.clone()]
    );
    // The notification names the device as its API does.
    let notes = app
        .get(&format!("/v1/notifications?lease_id={lease_id}"))
        .await
        .body;
    let changed = notes["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["event_type"] == "reservation.resources_changed")
        .cloned()
        .unwrap_or_else(|| panic!("no resources_changed: {notes}"));
    assert_eq!(
        changed["payload"]["detail"]["resource"],
        json!(from),
        "{changed}"
    );
    // The freed device is taken; with nothing else free the lease keeps its device.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "e",
                "2030-01-01 09:00",
                "2030-01-01 13:00",
                json!([{"resource_type": "device", "min": 1, "max": 1, "resource_properties": ""}]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app
        .put(&format!("/v1/devices/{to}/allocation"), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.body["error_message"]
            .as_str()
            .unwrap()
            .ends_with(&format!("it keeps device {to}")),
        "{}",
        r.body
    );
    let shown = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(shown["lease"]["degraded"], false, "{shown}");
    assert_eq!(
        holder(&app.get("/v1/devices/allocations").await.body).len(),
        2
    );
    // Only devices and hosts are re-allocated.
    let net = segment(&app, 5, json!({})).await;
    let r = app
        .put(&format!("/v1/networks/{net}/allocation"), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.body);
}

#[tokio::test]
async fn a_lease_lists_its_hosts_networks_and_devices() {
    let mut app = TestApp::spawn().await;
    let h1 = app
        .create_host("h1", json!({"rack": "r1", "secret_rack": "s1"}))
        .await;
    app.create_host("h2", json!({})).await;
    let r = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 200}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let segment = r.body["network"]["id"].as_str().unwrap().to_string();
    let gpu = device(&app, "gpu-1", json!({"slot": "a", "secret_slot": "s9"})).await;
    for path in [
        "/v1/os-hosts/properties/secret_rack",
        "/v1/devices/properties/secret_slot",
    ] {
        let r = app.patch(path, json!({"private": true})).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
    }
    app.act_as("alpha", "alpha-user", "member");
    let r = app
        .post(
            "/v1/leases",
            lease(
                "everything",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([
                    {"resource_type": "physical:host", "min": 1, "max": 1,
                     "hypervisor_properties": "", "resource_properties": "[\"==\", \"$hypervisor_hostname\", \"h1\"]"},
                    {"resource_type": "virtual:instance", "amount": 1, "vcpus": 1,
                     "memory_mb": 512, "disk_gb": 1, "affinity": null, "resource_properties": ""},
                    {"resource_type": "network", "network_name": "lab", "resource_properties": ""},
                    {"resource_type": "device", "min": 1, "max": 1, "resource_properties": ""}
                ]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    // Only the host reservation's host: not the one lending an instance slot.
    let hosts = app.get(&format!("/v1/leases/{id}/hosts")).await;
    assert_eq!(hosts.status, StatusCode::OK, "{}", hosts.body);
    let listed: Vec<&str> = hosts.body["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, vec![h1.as_str()]);
    assert_eq!(hosts.body["hosts"][0]["hypervisor_hostname"], "h1");
    let networks = app.get(&format!("/v1/leases/{id}/networks")).await;
    assert_eq!(networks.status, StatusCode::OK, "{}", networks.body);
    assert_eq!(networks.body["networks"].as_array().unwrap().len(), 1);
    assert_eq!(networks.body["networks"][0]["id"], json!(segment));
    assert_eq!(networks.body["networks"][0]["segment_id"], 200);
    let devices = app.get(&format!("/v1/leases/{id}/devices")).await;
    assert_eq!(devices.status, StatusCode::OK, "{}", devices.body);
    assert_eq!(devices.body["devices"][0]["id"], json!(gpu));
    assert_eq!(devices.body["devices"][0]["name"], "gpu-1");
    // A member is not told private properties, nor the operator's trust; public ones stay.
    let host = &hosts.body["hosts"][0];
    assert_eq!(host["rack"], "r1", "{host}");
    assert!(host.get("secret_rack").is_none(), "{host}");
    assert_eq!(host["trust_id"], "", "{host}");
    let device_shown = &devices.body["devices"][0];
    assert_eq!(device_shown["slot"], "a", "{device_shown}");
    assert!(device_shown.get("secret_slot").is_none(), "{device_shown}");
    // An admin is.
    app.act_as_admin();
    let hosts = app.get(&format!("/v1/leases/{id}/hosts")).await;
    assert_eq!(
        hosts.body["hosts"][0]["secret_rack"], "s1",
        "{}",
        hosts.body
    );
    let devices = app.get(&format!("/v1/leases/{id}/devices")).await;
    assert_eq!(
        devices.body["devices"][0]["secret_slot"], "s9",
        "{}",
        devices.body
    );
    // Another project is refused as it is for the lease itself; an unknown one is 404.
    app.act_as("beta", "beta-user", "member");
    let shown = app.get(&format!("/v1/leases/{id}")).await;
    assert_eq!(shown.status, StatusCode::FORBIDDEN, "{}", shown.body);
    let r = app.get(&format!("/v1/leases/{id}/hosts")).await;
    assert_eq!(r.status, shown.status, "{}", r.body);
    assert_eq!(r.message(), shown.message());
    app.act_as_admin();
    let r = app.get("/v1/leases/no-such-lease/networks").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    // A lease without such reservations lists none.
    let r = app
        .host_lease(
            "hosts-only",
            "2031-01-01 10:00",
            "2031-01-01 12:00",
            1,
            1,
            "",
        )
        .await;
    let other = r.body["lease"]["id"].as_str().unwrap().to_string();
    let r = app.get(&format!("/v1/leases/{other}/devices")).await;
    assert_eq!(r.body, json!({"devices": []}));
}

/// Names longer than the columns that hold them in Blazar and Nova are refused at the edge
/// (PostgreSQL would otherwise refuse the index entry of a very long one).
#[tokio::test]
async fn overlong_names_are_refused() {
    let app = TestApp::spawn().await;
    let long = "n".repeat(256);
    for (path, body) in [
        ("/v1/devices", json!({"name": long})),
        ("/v1/flavors", json!({"name": long, "vcpus": 1, "ram": 64})),
        (
            "/v1/flavors",
            json!({"id": long, "name": "m1", "vcpus": 1, "ram": 64}),
        ),
        (
            "/v1/floatingips",
            json!({"floating_network_id": long, "floating_ip_address": "172.24.4.10"}),
        ),
    ] {
        let r = app.post(path, body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert!(
            r.message().contains("at most 255 characters"),
            "{}",
            r.message()
        );
    }
    // Nothing a column cannot hold, nor a control character in a name.
    for (path, body) in [
        ("/v1/devices", json!({"name": "gpu\u{0}0"})),
        ("/v1/devices", json!({"name": "gpu", "vendor": "a\u{0}b"})),
        (
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "phys\nnet", "segment_id": 7}),
        ),
        ("/v1/os-hosts", json!({"name": "h", "rack": "r\u{0}1"})),
    ] {
        let r = app.post(path, body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert!(
            r.message().contains("control characters"),
            "{}",
            r.message()
        );
    }
    let fits = "n".repeat(255);
    device(&app, &fits, json!({})).await;
    assert_eq!(
        app.get("/v1/devices").await.body["devices"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// A path segment that is not UTF-8 once decoded is a 400 in Blazar's error format.
#[tokio::test]
async fn undecodable_path_segments_are_bad_requests() {
    let app = TestApp::spawn().await;
    for path in [
        "/v1/leases/%FF",
        "/v1/os-hosts/%C3%28",
        "/v1/devices/%FF%FE",
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert_eq!(r.body["error_code"], 400, "{path}: {}", r.body);
    }
}

#[tokio::test]
async fn pool_resource_fields_are_text() {
    let app = TestApp::spawn().await;
    let cases = [
        (
            "/v1/floatingips",
            json!({"floating_network_id": "n", "floating_ip_address": "10.0.0.7",
                   "subnet_id": ["x"]}),
            "Malformed parameter subnet_id: expected a string",
        ),
        (
            "/v1/floatingips",
            json!({"floating_network_id": 7, "floating_ip_address": "10.0.0.7"}),
            "Malformed parameter floating_network_id: expected a string",
        ),
        (
            "/v1/networks",
            json!({"network_type": 1, "segment_id": "5"}),
            "Malformed parameter network_type: expected a string",
        ),
        (
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": {"a": 1}, "segment_id": 5}),
            "Malformed parameter physical_network: expected a string",
        ),
        (
            "/v1/devices",
            json!({"name": "d2", "device_type": 1}),
            "Malformed parameter device_type: expected a string",
        ),
    ];
    for (path, body, message) in cases {
        let r = app.post(path, body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert!(r.message().contains(message), "{body}: {}", r.message());
    }
    // Nothing was registered; text and a left-out optional field still are.
    for (path, key) in [
        ("/v1/floatingips", "floatingips"),
        ("/v1/networks", "networks"),
        ("/v1/devices", "devices"),
    ] {
        assert_eq!(app.get(path).await.body[key], json!([]), "{path}");
    }
    let r = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": null, "segment_id": "5"}),
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    assert_eq!(r.body["network"]["segment_id"], 5);
}

#[tokio::test]
async fn a_resource_has_at_most_256_extra_capabilities() {
    let app = TestApp::spawn().await;
    let many = |n: usize, from: usize| -> serde_json::Map<String, Value> {
        (from..from + n)
            .map(|i| (format!("k{i}"), json!("v")))
            .collect()
    };
    // Hosts: at create, and what an update would leave.
    let mut body = many(257, 0);
    body.insert("name".into(), json!("h-many"));
    let r = app.post("/v1/os-hosts", Value::Object(body)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(
        r.message(),
        "Too many extra capabilities: 257 given, a resource may have at most 256"
    );
    let mut body = many(200, 0);
    body.insert("name".into(), json!("h-many"));
    let r = app.post("/v1/os-hosts", Value::Object(body)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let host = r.body["host"]["id"].as_str().unwrap().to_string();
    let path = format!("/v1/os-hosts/{host}");
    let r = app.put(&path, Value::Object(many(57, 200))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    // Nothing of a refused update is kept.
    let r = app.get(&path).await;
    assert!(r.body["host"].get("k200").is_none(), "{}", r.body);
    // Removing some makes room for as many.
    let mut body = many(56, 200);
    for i in 0..10 {
        body.insert(format!("k{i}"), Value::Null);
    }
    let r = app.put(&path, Value::Object(body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // 246 now: ten more make 256, one more is too many.
    let r = app.put(&path, Value::Object(many(11, 300))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let r = app.put(&path, Value::Object(many(10, 300))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    // Devices and network segments alike.
    let mut body = many(257, 0);
    body.insert("name".into(), json!("dev-many"));
    let r = app.post("/v1/devices", Value::Object(body)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let device = device(&app, "dev-1", Value::Object(many(256, 0))).await;
    let r = app
        .put(&format!("/v1/devices/{device}"), json!({"one-more": "v"}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let network = segment(&app, 100, json!({})).await;
    let r = app
        .put(
            &format!("/v1/networks/{network}"),
            Value::Object(many(257, 0)),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}

/// A device's or segment's capability that a reservation holding it filters on cannot
/// change value or go while that reservation is current or to come (the grant would be
/// wrong after the fact); new capabilities, and ones nobody filters on, may.
#[tokio::test]
async fn a_capability_its_holders_filter_on_cannot_change_under_them() {
    let app = TestApp::spawn().await;
    let d = device(&app, "gpu-1", json!({"gpu_model": "A100", "rack": "r1"})).await;
    let n = segment(&app, 200, json!({"tier": "gold", "zone": "z1"})).await;
    let booked = app
        .post(
            "/v1/leases",
            lease(
                "holders",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([
                    {"resource_type": "device", "min": 1, "max": 1,
                     "resource_properties": r#"["==", "$gpu_model", "A100"]"#},
                    {"resource_type": "network", "network_name": "held",
                     "network_properties": r#"["==", "$tier", "gold"]"#,
                     "resource_properties": ""}
                ]),
            ),
        )
        .await;
    assert_eq!(booked.status, StatusCode::CREATED, "{}", booked.body);
    let lease_id = booked.body["lease"]["id"].as_str().unwrap().to_string();

    for (path, body, key) in [
        (
            format!("/v1/devices/{d}"),
            json!({"gpu_model": "V100"}),
            "gpu_model",
        ),
        (
            format!("/v1/devices/{d}"),
            json!({"gpu_model": null}),
            "gpu_model",
        ),
        (
            format!("/v1/networks/{n}"),
            json!({"tier": "silver"}),
            "tier",
        ),
    ] {
        let r = app.put(&path, body.clone()).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{path} {body}: {}", r.body);
        let noun = if path.contains("devices") {
            format!("device {d}")
        } else {
            format!("network segment {n}")
        };
        assert_eq!(
            r.message(),
            format!("Can't add extracapabilities ['{key}'] to {noun}")
        );
    }
    let shown = app.get(&format!("/v1/devices/{d}")).await;
    assert_eq!(shown.body["device"]["gpu_model"], "A100", "refused whole");
    let shown = app.get(&format!("/v1/networks/{n}")).await;
    assert_eq!(shown.body["network"]["tier"], "gold", "refused whole");

    // What no holder filters on, and what is new, changes.
    for (path, body) in [
        (
            format!("/v1/devices/{d}"),
            json!({"rack": "r2", "vendor": "nv"}),
        ),
        (format!("/v1/networks/{n}"), json!({"zone": "z2"})),
        (format!("/v1/devices/{d}"), json!({"gpu_model": "A100"})),
    ] {
        let r = app.put(&path, body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{path} {body}: {}", r.body);
    }
    let shown = app.get(&format!("/v1/devices/{d}")).await;
    assert_eq!(shown.body["device"]["rack"], "r2");
    assert_eq!(shown.body["device"]["vendor"], "nv");

    // Once the lease is gone nothing holds them.
    let r = app.delete(&format!("/v1/leases/{lease_id}")).await;
    assert!(r.status.is_success(), "{}", r.body);
    let r = app
        .put(&format!("/v1/devices/{d}"), json!({"gpu_model": "V100"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app
        .put(&format!("/v1/networks/{n}"), json!({"tier": null}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// A device's capability changed while bookings that filter on its old value race for it:
/// either the change is refused (a booking holding the device filters on it) or the
/// bookings miss the device, never both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_device_capability_changed_under_racing_bookings_is_refused_or_they_miss_it() {
    let app = TestApp::spawn().await;
    for round in 0..12u64 {
        let pool = format!("moving-{round}");
        let id = device(&app, &format!("dev-{round}"), json!({"pool": pool})).await;
        let filter = format!(r#"["==", "$pool", "{pool}"]"#);
        let bookings = (0..8).map(|day| {
            app.post(
                "/v1/leases",
                lease(
                    &format!("follow-{round}-{day}"),
                    &format!("2030-01-{:02} 10:00", day + 1),
                    &format!("2030-01-{:02} 12:00", day + 1),
                    json!([{"resource_type": "device", "min": 1, "max": 1,
                            "resource_properties": filter}]),
                ),
            )
        });
        let change = async {
            tokio::time::sleep(std::time::Duration::from_millis(round * 2)).await;
            app.put(&format!("/v1/devices/{id}"), json!({"pool": "elsewhere"}))
                .await
        };
        let (_, changed) = tokio::join!(join_all(bookings), change);
        let held = app.get(&format!("/v1/devices/{id}/allocation")).await;
        crate::harness::assert_refused_or_missed(round, &changed, &held, "allocation");
    }
}
