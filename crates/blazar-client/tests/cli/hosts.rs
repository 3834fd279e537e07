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
