//! `lease-offers` and `lease-create --earliest`, as a user runs them.

use serde_json::Value;

use crate::harness::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offers_then_earliest_create() {
    let s = Server::start().await;
    for name in ["compute-1", "compute-2", "compute-3"] {
        s.blazar(&["host-create", name]).await.ok();
    }
    s.blazar(&[
        "lease-create",
        "--physical-reservation",
        "min=2,max=2,hypervisor_properties=,resource_properties=",
        "--start-date",
        "2030-01-01 09:00",
        "--end-date",
        "2030-01-01 12:00",
        "busy",
    ])
    .await
    .ok();
    // Two hosts for three hours, within a day from 08:00: the first window is after "busy".
    let request = [
        "--physical-reservation",
        "min=2,max=2,hypervisor_properties=,resource_properties=",
        "--duration",
        "3h",
        "--start-date",
        "2030-01-01 08:00",
        "--within",
        "1d",
    ];
    let search = [&["lease-offers"][..], &request, &["--limit", "2"]].concat();
    let run = s.blazar(&[&search[..], &["-f", "json"]].concat()).await;
    let offers: Value = serde_json::from_str(run.ok()).unwrap();
    assert_eq!(offers.as_array().unwrap().len(), 2, "{offers}");
    assert_eq!(offers[0]["start_date"], "2030-01-01T12:00:00.000000");
    assert_eq!(offers[0]["end_date"], "2030-01-01T15:00:00.000000");
    assert_eq!(offers[0]["duration"], 180);
    assert_eq!(offers[0]["resources"][0]["resource_type"], "physical:host");

    let table = s.blazar(&[&search[..], &["--utc"]].concat()).await;
    let text = table.ok();
    assert!(text.contains("start_date"), "{text}");
    assert!(
        text.contains("physical:host: compute-1, compute-2"),
        "{text}"
    );
    assert!(text.contains("3h"), "{text}");

    // A dry run of the same booking answers the lease it would make and books nothing.
    let earliest = |options: &[&'static str]| {
        [
            &["lease-create", "--earliest"][..],
            options,
            &request,
            &["soonest"],
        ]
        .concat()
    };
    let dry = s.blazar(&earliest(&["--dry-run"])).await;
    let text = dry.ok();
    assert!(text.starts_with("Would create a new lease:"), "{text}");
    assert!(text.contains("2030-01-01T12:00:00.000000"), "{text}");
    // In a machine format only the lease is on stdout; the notes go to stderr.
    let dry = s.blazar(&earliest(&["--dry-run", "-f", "json"])).await;
    let lease: Value = serde_json::from_str(dry.ok()).unwrap();
    assert_eq!(lease["start_date"], "2030-01-01T12:00:00.000000");
    assert!(
        dry.stderr.contains("Dry run: nothing was written."),
        "{}",
        dry.stderr
    );
    let listed = s.blazar(&["lease-list", "-f", "json"]).await;
    let leases: Value = serde_json::from_str(listed.ok()).unwrap();
    assert_eq!(leases.as_array().unwrap().len(), 1, "{leases}");

    let created = s.blazar(&earliest(&["-f", "json"])).await;
    // As python-blazarclient prints it: a line, then the lease.
    let text = created.ok().trim_start_matches("Created a new lease:\n");
    let lease: Value = serde_json::from_str(text).unwrap();
    assert_eq!(lease["start_date"], "2030-01-01T12:00:00.000000");
    assert_eq!(lease["end_date"], "2030-01-01T15:00:00.000000");

    // Wrong usage is caught before any request.
    let bad = s
        .blazar(&[
            "lease-offers",
            "--physical-reservation",
            "min=1,max=1",
            "--duration",
            "90s",
        ])
        .await;
    assert_eq!(bad.code, 1, "{}", bad.transcript());
    assert!(bad.stderr.contains("whole minutes"), "{}", bad.transcript());
    let bad = s
        .blazar(&[
            "lease-create",
            "--earliest",
            "--physical-reservation",
            "min=1,max=1",
            "x",
        ])
        .await;
    assert_eq!(bad.code, 2, "{}", bad.transcript());
}
