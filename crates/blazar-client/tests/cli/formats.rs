//! Output formats (`-f yaml|csv|value|shell|json`, `-c`, sorting), local-time display,
//! help and shell completion.

use crate::assert_transcript;
use crate::harness::{Server, one_host_lease};

async fn one_lease(s: &Server) {
    s.blazar(&["host-create", "--extra", "gpu=true", "compute-1"])
        .await
        .ok();
    s.blazar(&["host-create", "compute-2"]).await.ok();
    s.blazar(&one_host_lease("lease-1", &[])).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_formats() {
    let s = Server::start().await;
    one_lease(&s).await;
    let runs = vec![
        s.blazar(&["host-list", "-f", "csv"]).await,
        s.blazar(&[
            "host-list",
            "-f",
            "csv",
            "--quote",
            "minimal",
            "-c",
            "hypervisor_hostname",
        ])
        .await,
        s.blazar(&["host-list", "-f", "json"]).await,
        s.blazar(&["host-list", "-f", "json", "--noindent", "-c", "id"])
            .await,
        s.blazar(&["host-list", "-f", "yaml"]).await,
        s.blazar(&[
            "host-list",
            "--sort-column",
            "hypervisor_hostname",
            "--sort-descending",
            "-f",
            "value",
            "-c",
            "hypervisor_hostname",
        ])
        .await,
        s.blazar(&["host-show", "-f", "yaml", "compute-1"]).await,
        s.blazar(&[
            "host-show",
            "-f",
            "shell",
            "--prefix",
            "host_",
            "-c",
            "id",
            "-c",
            "gpu",
            "compute-1",
        ])
        .await,
        s.blazar(&[
            "lease-show",
            "-f",
            "yaml",
            "-c",
            "events",
            "-c",
            "status",
            "lease-1",
        ])
        .await,
        s.blazar(&["allocation-list", "host", "-f", "yaml"]).await,
        s.blazar(&["allocation-list", "host", "-f", "json", "--noindent"])
            .await,
        s.blazar(&["lease-show", "-c", "nope", "lease-1"]).await,
        s.blazar(&["lease-list", "-f", "xml"]).await,
    ];
    assert_transcript!("machine_formats", runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_show_local_time_unless_utc() {
    let s = Server::start().await;
    one_lease(&s).await;
    // A fixed zone without daylight saving time, so the snapshot holds all year.
    let env = [("BLAZAR_URL", s.base.as_str()), ("TZ", "IST-5:30")];
    let runs = [
        s.blazar_with(&["lease-list"], &env).await,
        s.blazar_with(&["lease-list", "--utc"], &env).await,
        s.blazar_with(&["lease-list", "-f", "value", "-c", "start_date"], &env)
            .await,
        s.blazar_with(&["allocation-show", "host", "compute-1"], &env)
            .await,
    ];
    assert_transcript!("local_time", runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_and_completion() {
    let s = Server::start().await;
    let help = s.blazar(&["lease-create", "--help"]).await;
    assert!(
        help.ok().contains("Examples:\n  blazar lease-create"),
        "{}",
        help.stdout
    );
    assert!(
        help.stdout.contains("--physical-reservation"),
        "{}",
        help.stdout
    );
    let top = s.blazar(&["--help"]).await;
    for command in [
        "lease-wait",
        "host-property-set",
        "allocation-show",
        "completion",
    ] {
        assert!(top.ok().contains(command), "{command} missing from --help");
    }
    for shell in ["bash", "zsh", "fish"] {
        let script = s.blazar(&["completion", shell]).await;
        assert!(script.ok().contains("lease-create"), "{shell} completion");
        assert!(
            script.stdout.contains("physical-reservation"),
            "{shell} completion"
        );
    }
    let version = s.blazar(&["--version"]).await;
    assert!(version.ok().starts_with("blazar "), "{}", version.stdout);
}
