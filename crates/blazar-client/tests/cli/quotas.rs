//! `quota-*` commands, and a lease refused for its project's quota, as a user sees them.

use crate::assert_transcript;
use crate::harness::{Server, one_host_lease};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_set_show_refuse_and_delete() {
    let s = Server::start().await;
    for name in ["compute-1", "compute-2"] {
        s.blazar(&["host-create", name]).await.ok();
    }
    let lease = |name| one_host_lease(name, &["-f", "value", "-c", "name"]);
    let runs = vec![
        s.blazar(&["quota-list"]).await,
        s.blazar(&["quota-show", "admin-project"]).await,
        s.blazar(&[
            "quota-set",
            "--hosts",
            "1",
            "--max-lease-duration",
            "-1",
            "--host-hours-per-month",
            "100",
            "admin-project",
        ])
        .await,
        s.blazar(&["quota-set", "admin-project"]).await,
        s.blazar(&["quota-set", "--hosts", "-5", "admin-project"])
            .await,
        s.blazar(&one_host_lease(
            "first",
            &["-f", "value", "-c", "name", "--dry-run"],
        ))
        .await,
        s.blazar(&lease("first")).await,
        s.blazar(&lease("second")).await,
        s.blazar(&[
            "quota-list",
            "-f",
            "value",
            "-c",
            "project_id",
            "-c",
            "hosts",
        ])
        .await,
        s.blazar(&[
            "quota-set",
            "--unset",
            "max_lease_duration",
            "admin-project",
        ])
        .await,
        s.blazar(&["quota-delete", "admin-project"]).await,
        s.blazar(&["quota-delete", "admin-project"]).await,
        s.blazar(&lease("second")).await,
    ];
    assert_transcript!("quotas", runs);
}
