//! `lease-actions` and `action-list`: what was done in the cloud for a lease, also once the
//! lease is deleted, and across leases.

use blazar_testkit::t;

use crate::harness::{Server, one_host_lease};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leases_actions_are_listed_by_name_and_after_its_delete_by_id() {
    let s = Server::start().await;
    s.blazar(&["host-create", "compute-1"]).await.ok();
    s.blazar(&one_host_lease("demo", &[])).await.ok();
    let id = s
        .blazar(&["lease-show", "demo", "-f", "value", "-c", "id"])
        .await
        .ok()
        .trim()
        .to_string();
    s.tick_at(t(2030, 1, 1, 10, 0)).await;
    let shown = s
        .blazar(&[
            "lease-actions",
            "demo",
            "-f",
            "value",
            "-c",
            "kind",
            "-c",
            "purpose",
            "-c",
            "status",
        ])
        .await;
    assert_eq!(shown.ok(), "start lease_start done\n");

    s.blazar(&["lease-delete", "demo"]).await.ok();
    let shown = s
        .blazar(&[
            "lease-actions",
            &id,
            "-f",
            "value",
            "-c",
            "kind",
            "-c",
            "purpose",
            "-c",
            "status",
        ])
        .await;
    assert_eq!(shown.ok(), "start lease_start done\nstop delete done\n");

    // Across leases, newest first, a page at a time.
    let listed = s
        .blazar(&["action-list", "-f", "value", "-c", "lease_id", "-c", "kind"])
        .await;
    assert_eq!(listed.ok(), format!("{id} stop\n{id} start\n"));
    let newest = s
        .blazar(&["action-list", "--limit", "1", "-f", "value", "-c", "seq"])
        .await;
    let seq = newest.ok().trim().to_string();
    let next = s
        .blazar(&["action-list", "--marker", &seq, "-f", "value", "-c", "kind"])
        .await;
    assert_eq!(next.ok(), "start\n");
    let failed = s
        .blazar(&[
            "action-list",
            "--status",
            "failed",
            "--status",
            "pending",
            "-f",
            "value",
        ])
        .await;
    assert_eq!(failed.ok(), "");
    let mine = s
        .blazar(&[
            "action-list",
            "--lease",
            &id,
            "--status",
            "done",
            "-f",
            "value",
            "-c",
            "kind",
        ])
        .await;
    assert_eq!(mine.ok(), "stop\nstart\n");

    // A status the server does not know is refused before asking it.
    let bad = s.blazar(&["action-list", "--status", "broken"]).await;
    assert_eq!(bad.code, 2, "{}", bad.transcript());
    assert!(bad.stderr.contains("broken"), "{}", bad.transcript());
}
