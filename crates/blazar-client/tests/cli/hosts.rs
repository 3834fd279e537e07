//! Hosts, host properties and host allocations, as in the Python client's transcript.

use crate::assert_transcript;
use crate::harness::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_inventory() {
    let s = Server::start().await;
    let runs = vec![
        s.blazar(&["host-list"]).await,
        s.blazar(&[
            "host-create",
            "--extra",
            "vcpus=8",
            "--extra",
            "memory_mb=16384",
            "--extra",
            "local_gb=100",
            "compute-1",
        ])
        .await,
        s.blazar(&[
            "host-create",
            "--extra",
            "gpu=true",
            "--extra",
            "rack=r1",
            "compute-2",
        ])
        .await,
        s.blazar(&[
            "host-create",
            "--extra",
            "gpu=false",
            "--extra",
            "rack=r2",
            "--extra",
            "vcpus=32",
            "compute-3",
        ])
        .await,
        s.blazar(&["host-create", "compute-1"]).await,
        s.blazar(&["host-list"]).await,
        s.blazar(&[
            "host-list",
            "-f",
            "value",
            "-c",
            "id",
            "-c",
            "hypervisor_hostname",
        ])
        .await,
        s.blazar(&["host-show", "compute-2"]).await,
        s.blazar(&["host-show", "-f", "json", "2"]).await,
        s.blazar(&["host-show", "999"]).await,
        s.blazar(&["host-show", "compute-9"]).await,
        s.blazar(&[
            "host-update",
            "--extra",
            "rack=r9",
            "--extra",
            "owner=team-a",
            "compute-2",
        ])
        .await,
        s.blazar(&["host-show", "-c", "owner", "-c", "rack", "compute-2"])
            .await,
        s.blazar(&["host-unset", "--extra", "owner", "compute-2"])
            .await,
        s.blazar(&["host-show", "-f", "value", "-c", "owner", "compute-2"])
            .await,
        s.blazar(&["host-update", "compute-2"]).await,
        s.blazar(&["host-list", "--sort-by", "nope"]).await,
    ];
    assert_transcript!("host_inventory", runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_properties() {
    let s = Server::start().await;
    for (name, gpu, rack) in [("compute-2", "true", "r1"), ("compute-3", "false", "r2")] {
        s.blazar(&[
            "host-create",
            "--extra",
            &format!("gpu={gpu}"),
            "--extra",
            &format!("rack={rack}"),
            name,
        ])
        .await
        .ok();
    }
    let runs = vec![
        s.blazar(&["host-property-list"]).await,
        s.blazar(&["host-property-list", "--detail"]).await,
        s.blazar(&["host-property-show", "rack"]).await,
        s.blazar(&["host-property-show", "-f", "json", "rack"])
            .await,
        s.blazar(&["host-property-set", "--private", "rack"]).await,
        s.blazar(&["host-property-list", "--detail"]).await,
        s.blazar(&["host-property-list", "--all", "--detail"]).await,
        s.blazar(&["host-property-set", "--public", "rack"]).await,
        s.blazar(&["host-property-show", "nope"]).await,
        s.blazar(&["host-property-set", "rack"]).await,
        s.blazar(&["host-delete", "compute-3"]).await,
        s.blazar(&["host-list", "-f", "value", "-c", "hypervisor_hostname"])
            .await,
    ];
    assert_transcript!("host_properties", runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floating_ips_networks_devices_and_flavors() {
    let s = Server::start().await;
    let net = "2b1a7f3c-5d3e-4a43-9a1e-3f7d7c0d9a01";
    let mut runs = vec![
        s.blazar(&["floatingip-create", net, "172.24.4.200"]).await,
        s.blazar(&["floatingip-create", net, "172.24.4.201"]).await,
        s.blazar(&["floatingip-list", "--sort-by", "floating_ip_address"])
            .await,
    ];
    let fip = s
        .blazar(&[
            "floatingip-list",
            "--sort-by",
            "floating_ip_address",
            "-f",
            "value",
            "-c",
            "id",
        ])
        .await
        .ok()
        .lines()
        .next()
        .unwrap()
        .to_string();
    runs.extend([
        s.blazar(&["floatingip-show", &fip]).await,
        s.blazar(&[
            "lease-create", "--reservation",
            &format!("resource_type=virtual:floatingip,network_id={net},amount=1,required_floatingips=[\"172.24.4.200\"]"),
            "--start-date", "2030-01-05 10:00", "--end-date", "2030-01-05 12:00", "-c", "reservations", "fip-lease",
        ])
        .await,
        s.blazar(&["floatingip-delete", &fip]).await,
        s.blazar(&["network-create", "--network-type", "vlan", "--segment", "1001"]).await,
        s.blazar(&[
            "network-create", "--network-type", "vlan", "--physical-network", "physnet1", "--segment", "1001",
            "--extra", "stitchable=true",
        ])
        .await,
        s.blazar(&["network-list"]).await,
        s.blazar(&["network-update", "--extra", "stitchable=false", "1001"]).await,
        s.blazar(&["network-show", "-c", "segment_id", "-c", "stitchable", "1001"]).await,
        s.blazar(&["network-property-list", "--detail"]).await,
        s.blazar(&["network-delete", "1001"]).await,
        s.blazar(&[
            "device-create", "--device-type", "container", "--device-driver", "k8s", "--extra", "machine=rpi4",
            "edge-1",
        ])
        .await,
        s.blazar(&["device-list"]).await,
        s.blazar(&["device-update", "--extra", "machine=rpi5", "edge-1"]).await,
        s.blazar(&["device-unset", "--extra", "machine", "edge-1"]).await,
        s.blazar(&["device-show", "-f", "yaml", "edge-1"]).await,
        s.blazar(&["device-delete", "edge-1"]).await,
        s.blazar(&["flavor-create", "--vcpus", "4", "--ram", "8192", "--disk", "40", "--extra-spec", "hw:cpu_policy=dedicated", "m1.large"]).await,
        s.blazar(&["flavor-list"]).await,
        s.blazar(&["flavor-show", "-f", "json", "m1.large"]).await,
        s.blazar(&["flavor-delete", "m1.large"]).await,
        s.blazar(&["flavor-show", "m1.large"]).await,
    ]);
    assert_transcript!("floating_ips_networks_devices_and_flavors", runs);
}

/// The resource ids a lease holds, as the API lists them (`os-hosts` or `devices`).
async fn held_by(s: &Server, kind: &str, lease_id: &str) -> Vec<String> {
    let body: serde_json::Value = reqwest::get(format!(
        "{}/v1/{kind}/allocations?lease_id={lease_id}",
        s.base
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["reservations"] != serde_json::json!([]))
        .map(|a| a["resource_id"].as_str().unwrap().to_string())
        .collect()
}

/// Creates lease `name` of one resource (`option` and its `reservation`) on 2030-01-01,
/// 10:00 to 12:00 UTC, and returns its id.
async fn create_lease(s: &Server, option: &str, reservation: &str, name: &str) -> String {
    let lease = s
        .blazar(&[
            "lease-create",
            option,
            reservation,
            "--start-date",
            "2030-01-01 10:00",
            "--end-date",
            "2030-01-01 12:00",
            "-f",
            "value",
            "-c",
            "id",
            name,
        ])
        .await;
    lease.ok().lines().last().unwrap().trim().to_string()
}

/// Creates device `name`: a k8s container with the extra capability `machine=rpi4`.
async fn create_device(s: &Server, name: &str) {
    s.blazar(&[
        "device-create",
        "--device-type",
        "container",
        "--device-driver",
        "k8s",
        "--extra",
        "machine=rpi4",
        name,
    ])
    .await
    .ok();
}

/// `<kind>-reallocate --lease-id LEASE NAME`, checked, then the resources the lease holds
/// (`path` as in [`held_by`]).
async fn reallocate(s: &Server, kind: &str, path: &str, lease_id: &str, name: &str) -> Vec<String> {
    let run = s
        .blazar(&[&format!("{kind}-reallocate"), "--lease-id", lease_id, name])
        .await;
    assert_eq!(run.ok(), format!("Reallocated {kind}: {name}\n"));
    held_by(s, path, lease_id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reallocate_moves_a_lease_off_a_host_or_a_device() {
    let s = Server::start().await;
    for name in ["compute-1", "compute-2"] {
        s.blazar(&["host-create", "--extra", "rack=a", name])
            .await
            .ok();
    }
    let rack_a = r#"min=1,max=1,hypervisor_properties=,resource_properties=["==","$rack","a"]"#;
    let lease_id = create_lease(&s, "--physical-reservation", rack_a, "hosts").await;
    let before = held_by(&s, "os-hosts", &lease_id).await;
    assert_eq!(before.len(), 1);
    let name = if before[0] == "1" {
        "compute-1"
    } else {
        "compute-2"
    };
    let after = reallocate(&s, "host", "os-hosts", &lease_id, name).await;
    assert_eq!(after.len(), 1);
    assert_ne!(after, before, "the lease moved to the other host");

    for name in ["edge-1", "edge-2"] {
        create_device(&s, name).await;
    }
    let any_device = "resource_type=device,min=1,max=1,resource_properties=";
    let lease_id = create_lease(&s, "--reservation", any_device, "devices").await;
    let before = held_by(&s, "devices", &lease_id).await;
    assert_eq!(before.len(), 1);
    let after = reallocate(&s, "device", "devices", &lease_id, &before[0]).await;
    assert_eq!(after.len(), 1);
    assert_ne!(after, before);
    // Neither --lease-id nor --reservation-id: refused before any request.
    let run = s.blazar(&["device-reallocate", &after[0]]).await;
    assert_ne!(run.code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_and_device_properties_and_unset() {
    let s = Server::start().await;
    s.blazar(&[
        "network-create",
        "--network-type",
        "vlan",
        "--physical-network",
        "physnet1",
        "--segment",
        "1001",
        "--extra",
        "stitchable=true",
        "--extra",
        "zone=a",
    ])
    .await
    .ok();
    let run = s
        .blazar(&["network-unset", "--extra", "zone", "1001"])
        .await;
    run.ok();
    let shown = s.blazar(&["network-show", "-f", "json", "1001"]).await;
    let network: serde_json::Value = serde_json::from_str(shown.ok()).unwrap();
    assert!(network.get("zone").is_none(), "{network}");
    assert_eq!(network["stitchable"], "true");
    let shown = s
        .blazar(&["network-property-show", "-f", "json", "stitchable"])
        .await;
    let property: serde_json::Value = serde_json::from_str(shown.ok()).unwrap();
    assert_eq!(property["private"], false, "{property}");
    s.blazar(&["network-property-set", "--private", "stitchable"])
        .await
        .ok();
    // As with the Python client, a private property is shown only by listings with --all.
    let shown = s
        .blazar(&["network-property-show", "-f", "json", "stitchable"])
        .await;
    assert_ne!(shown.code, 0, "{}", shown.transcript());

    create_device(&s, "edge-1").await;
    let listed = s
        .blazar(&["device-property-list", "-f", "value", "-c", "property"])
        .await;
    assert!(
        listed.ok().lines().any(|l| l == "machine"),
        "{}",
        listed.ok()
    );
    s.blazar(&["device-property-set", "--private", "machine"])
        .await
        .ok();
    let shown = s
        .blazar(&["device-property-show", "-f", "json", "machine"])
        .await;
    assert_ne!(shown.code, 0, "{}", shown.transcript());
    s.blazar(&["device-property-set", "--public", "machine"])
        .await
        .ok();
    let shown = s
        .blazar(&["device-property-show", "-f", "json", "machine"])
        .await;
    let property: serde_json::Value = serde_json::from_str(shown.ok()).unwrap();
    assert_eq!(property["private"], false, "{property}");
}
