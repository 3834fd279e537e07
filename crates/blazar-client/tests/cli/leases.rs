//! Leases from creation to deletion, allocations, and the client-side checks, as in the
//! Python client's transcript.

use crate::assert_transcript;
use crate::harness::{ONE_HOST, Run, Server};

async fn three_hosts(s: &Server) {
    for args in [
        ["--extra", "memory_mb=16384", "compute-1"].as_slice(),
        ["--extra", "gpu=true", "--extra", "rack=r1", "compute-2"].as_slice(),
        ["--extra", "gpu=false", "--extra", "rack=r2", "compute-3"].as_slice(),
    ] {
        let mut argv = vec!["host-create"];
        argv.extend(args);
        s.blazar(&argv).await.ok();
    }
}

fn id_of(run: &Run) -> String {
    run.ok().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lifecycle() {
    let s = Server::start().await;
    three_hosts(&s).await;
    let mut runs = vec![
        s.blazar(&[
            "lease-create",
            "--physical-reservation",
            r#"min=1,max=2,hypervisor_properties=[">=", "$memory_mb", "32768"],resource_properties=["==", "$gpu", "true"]"#,
            "--start-date", "2030-01-01 10:00", "--end-date", "2030-01-01 12:00", "lease-1",
        ])
        .await,
    ];
    let id = id_of(
        &s.blazar(&["lease-show", "-f", "value", "-c", "id", "lease-1"])
            .await,
    );
    runs.extend([
        s.blazar(&[
            "lease-create",
            "--physical-reservation",
            r#"min=1,max=1,hypervisor_properties=,resource_properties=["==", "$gpu", "true"]"#,
            "--start-date",
            "2030-01-01 11:00",
            "--end-date",
            "2030-01-01 13:00",
            "lease-2",
        ])
        .await,
        s.blazar(&[
            "lease-create",
            "--physical-reservation",
            "min=2,max=2,hypervisor_properties=,resource_properties=",
            "--start-date",
            "2030-01-01 11:00",
            "--end-date",
            "2030-01-01 13:00",
            "lease-3",
        ])
        .await,
        s.blazar(&[
            "lease-create",
            "--physical-reservation",
            ONE_HOST,
            "--start-date",
            "2020-01-01 10:00",
            "--end-date",
            "2030-01-02 10:00",
            "lease-past",
        ])
        .await,
        // A minute later, so that the two leases named lease-3 list in a fixed order.
        {
            s.clock
                .set(crate::harness::epoch() + chrono::TimeDelta::minutes(1));
            s.blazar(&["lease-list", "-f", "value", "-c", "name"]).await
        },
        s.blazar(&[
            "lease-create",
            "--reservation",
            r#"resource_type=physical:host,min=1,max=1,resource_properties=["==", "$gpu", "true"]"#,
            "--start-date",
            "2030-01-03 10:00",
            "--end-date",
            "2030-01-03 12:00",
            "lease-3",
        ])
        .await,
        s.blazar(&["lease-list"]).await,
        s.blazar(&[
            "lease-list",
            "--sort-by",
            "start_date",
            "-f",
            "value",
            "-c",
            "name",
            "-c",
            "start_date",
        ])
        .await,
        s.blazar(&["lease-show", "lease-3"]).await,
        s.blazar(&["lease-show", "lease-9"]).await,
        s.blazar(&["lease-show", "00000000-0000-0000-0000-000000000000"])
            .await,
        s.blazar(&["lease-show", "-f", "json", &id]).await,
        s.blazar(&["allocation-list", "host"]).await,
        s.blazar(&["allocation-list", "host", "--lease-id", &id])
            .await,
        s.blazar(&["allocation-show", "host", "compute-2"]).await,
        s.blazar(&["lease-update", "--prolong-for", "1h", "lease-1"])
            .await,
        s.blazar(&["lease-update", "--end-date", "2030-01-01 15:00", "lease-1"])
            .await,
        s.blazar(&["lease-update", "--defer-by", "30m", "lease-1"])
            .await,
        s.blazar(&["lease-update", "--name", "lease-1-renamed", &id])
            .await,
        s.blazar(&[
            "lease-update",
            "--end-date",
            "2030-01-03 11:00",
            "lease-1-renamed",
        ])
        .await,
        s.blazar(&["lease-update", "lease-1-renamed"]).await,
        s.blazar(&[
            "lease-show",
            "-c",
            "start_date",
            "-c",
            "end_date",
            "-c",
            "name",
            &id,
        ])
        .await,
    ]);
    let reservation = {
        let out = s
            .blazar(&["lease-show", "-f", "json", "-c", "reservations", &id])
            .await;
        let json: serde_json::Value = serde_json::from_str(out.ok()).unwrap();
        let text = json["reservations"].as_str().unwrap().to_string();
        let reservation: serde_json::Value = serde_json::from_str(&text).unwrap();
        reservation["id"].as_str().unwrap().to_string()
    };
    runs.extend([
        s.blazar(&[
            "lease-update",
            "--reservation",
            &format!("id={reservation},max=1"),
            &id,
        ])
        .await,
        s.blazar(&["lease-update", "--reservation", "max=1", &id])
            .await,
        s.blazar(&["lease-delete", "lease-1-renamed"]).await,
        s.blazar(&["lease-delete", "lease-3"]).await,
        s.blazar(&["lease-delete", "00000000-0000-0000-0000-000000000000"])
            .await,
        s.blazar(&["host-delete", "compute-2"]).await,
        s.blazar(&["lease-list"]).await,
    ]);
    assert_transcript!("lease_lifecycle", runs);
}

/// python-blazarclient sends a lease without reservations, and the API takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_reservations_is_created() {
    let s = Server::start().await;
    let run = s
        .blazar(&[
            "lease-create",
            "--start-date",
            "2030-01-02 10:00",
            "--end-date",
            "2030-01-02 12:00",
            "-f",
            "json",
            "empty",
        ])
        .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    // "Created a new lease:", then the lease.
    let json = &run.stdout[run.stdout.find('{').expect("a JSON lease")..];
    let lease: serde_json::Value = serde_json::from_str(json).expect("a JSON lease");
    assert_eq!(lease["name"], "empty");
    assert!(
        lease["id"].as_str().is_some_and(|id| id.len() == 36),
        "{lease}"
    );
    let list = s.blazar(&["lease-list", "-f", "value", "-c", "name"]).await;
    assert_eq!(list.stdout.trim(), "empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_checks() {
    let s = Server::start().await;
    // Lease "bad" of one host, with `options`.
    let bad = |options: &[&'static str]| {
        [
            &["lease-create", "--physical-reservation", ONE_HOST][..],
            options,
            &["bad"],
        ]
        .concat()
    };
    let runs = vec![
        s.blazar(&bad(&[
            "--start-date",
            "2030-01-02 12:00",
            "--end-date",
            "2030-01-02 10:00",
        ]))
        .await,
        s.blazar(&bad(&["--start-date", "tomorrow"])).await,
        s.blazar(&bad(&["--start-date", "2030-01-02 12:00:30"]))
            .await,
        s.blazar(&[
            "lease-create",
            "--physical-reservation",
            "min=2,max=1",
            "bad",
        ])
        .await,
        s.blazar(&["lease-create", "--physical-reservation", "max=1", "bad"])
            .await,
        s.blazar(&[
            "lease-create",
            "--reservation",
            "resource_type=virtual:floatingip,required_floatingips=[oops",
            "bad",
        ])
        .await,
        s.blazar(&bad(&[
            "--end-date",
            "2030-01-02 10:00",
            "--duration",
            "1h",
        ]))
        .await,
        s.blazar(&[
            "lease-update",
            "--prolong-for",
            "1y",
            "00000000-0000-0000-0000-000000000000",
        ])
        .await,
        s.blazar(&[
            "lease-update",
            "--prolong-for",
            "1h",
            "--end-date",
            "2030-01-02 10:00",
            "x",
        ])
        .await,
        s.blazar(&["lease-list", "--sort-by", "status"]).await,
    ];
    assert_transcript!("client_side_checks", runs);

    // Without --end-date the end is 24h from now, which the message says (the date itself
    // depends on the real clock, so it stays out of the snapshot).
    let run = s.blazar(&bad(&["--start-date", "2030-01-02 10:00"])).await;
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.starts_with(
            "The lease parameters are incorrect: the start (2030-01-02 10:00) is after the \
             default end, 24h from now, ("
        ),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_reservations_reach_the_server_with_python_types() {
    // What the server receives is what python-blazarclient would send: ints as JSON ints,
    // defaults filled in (a floating IP reservation with no floating IP enrolled gets the
    // server's shortfall message, which names the defaults it was given).
    let s = Server::start().await;
    three_hosts(&s).await;
    let runs = [
        s.blazar(&[
            "lease-create",
            "--reservation",
            "resource_type=physical:host,min=1,max=1",
            "--start-date",
            "2030-02-01 10:00",
            "--duration",
            "2h",
            "-f",
            "value",
            "-c",
            "end_date",
            "-c",
            "reservations",
            "typed",
        ])
        .await,
        s.blazar(&[
            "lease-create",
            "--reservation",
            "resource_type=virtual:floatingip,network_id=net-1,amount=1",
            "--start-date",
            "2030-02-01 10:00",
            "--end-date",
            "2030-02-01 12:00",
            "fip",
        ])
        .await,
    ];
    assert_transcript!("generic_reservations", runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_runs_and_explained_refusals() {
    let s = Server::start().await;
    three_hosts(&s).await;
    let hosts = |n: &str| format!("min={n},max={n},hypervisor_properties=,resource_properties=");
    let window = [
        "--start-date",
        "2030-01-01 10:00",
        "--end-date",
        "2030-01-01 12:00",
    ];
    let create = |n: &str, name: &str, dry: bool| {
        let mut argv: Vec<String> = vec!["lease-create".into(), "--physical-reservation".into()];
        argv.push(hosts(n));
        argv.extend(window.iter().map(|a| a.to_string()));
        if dry {
            argv.push("--dry-run".into());
        }
        argv.push(name.into());
        argv
    };
    let run = |argv: Vec<String>| {
        let s = &s;
        async move {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            s.blazar(&argv).await
        }
    };

    let tried = run(create("2", "demo", true)).await;
    assert!(
        tried.ok().starts_with("Would create a new lease:\n"),
        "{}",
        tried.stdout
    );
    assert!(
        tried.stdout.ends_with("Dry run: nothing was written.\n"),
        "{}",
        tried.stdout
    );
    assert!(tried.stdout.contains("physical:host"), "{}", tried.stdout);
    let empty = s.blazar(&["lease-list", "-f", "value"]).await;
    assert_eq!(empty.ok(), "", "the dry run wrote no lease");

    let refused = run(create("4", "too-big", true)).await;
    assert_eq!(refused.code, 1);
    assert_eq!(
        refused.stderr,
        "ERROR: Not enough hosts available for reservation 1 (physical:host, min 4): 3 host(s) \
         match the filters and are reservable, 3 of them free from 2030-01-01 10:00 to \
         2030-01-01 12:00\n  reservation 1 (physical:host): requested min 4, max 4; 3 matching; \
         3 free from 2030-01-01 10:00 to 2030-01-01 12:00 UTC\n"
    );

    run(create("2", "demo", false)).await.ok();
    let prolonged = s
        .blazar(&["lease-update", "--prolong-for", "8h", "--dry-run", "demo"])
        .await;
    assert!(
        prolonged.ok().starts_with("Would update lease demo:\n"),
        "{}",
        prolonged.stdout
    );
    assert!(
        prolonged.stdout.contains("2030-01-01T20:00"),
        "{}",
        prolonged.stdout
    );
    assert!(
        prolonged
            .stdout
            .ends_with("Dry run: nothing was written.\n")
    );
    // In a machine format only the lease is on stdout.
    let as_json = s
        .blazar(&[
            "lease-update",
            "--prolong-for",
            "8h",
            "--dry-run",
            "-f",
            "json",
            "demo",
        ])
        .await;
    let lease: serde_json::Value = serde_json::from_str(as_json.ok()).unwrap();
    assert_eq!(lease["end_date"], "2030-01-01T20:00:00.000000", "{lease}");
    assert!(
        as_json.stderr.contains("Dry run: nothing was written."),
        "{}",
        as_json.stderr
    );
    let end = s
        .blazar(&["lease-show", "-f", "value", "-c", "end_date", "demo"])
        .await;
    assert_eq!(
        end.ok().trim(),
        "2030-01-01T12:00:00.000000",
        "nothing moved"
    );

    let runs = [
        tried,
        refused,
        prolonged,
        run(create("2", "second", true)).await,
        s.blazar(&["lease-update", "--prolong-for", "1h", "--dry-run", "demo"])
            .await,
        s.blazar(&["lease-create", "--dry-run", "--wait", "x"])
            .await,
    ];
    assert_transcript!("dry_runs_and_explained_refusals", runs);

    // A refused extension also says how far the lease can go on what it holds.
    s.blazar(&[
        "lease-create",
        "--physical-reservation",
        &hosts("3"),
        "--start-date",
        "2030-01-01 14:00",
        "--end-date",
        "2030-01-01 16:00",
        "later",
    ])
    .await
    .ok();
    let refused = s
        .blazar(&["lease-update", "--prolong-for", "4h", "--dry-run", "demo"])
        .await;
    assert_eq!(refused.code, 1, "{}", refused.transcript());
    assert!(
        refused
            .stderr
            .starts_with("ERROR: Not enough hosts available"),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.ends_with(
            "Keeping the resources it holds, the lease can end at 2030-01-01 14:00 UTC at \
             the latest.\n"
        ),
        "{}",
        refused.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shifts_past_the_calendar_are_refused_not_crashed_on() {
    let s = Server::start().await;
    s.blazar(&["host-create", "compute-1"]).await.ok();
    s.blazar(&crate::harness::one_host_lease("far", &[]))
        .await
        .ok();
    for option in ["--prolong-for", "--defer-by", "--advance-by"] {
        let run = s
            .blazar(&["lease-update", option, "20000000w", "far"])
            .await;
        assert_eq!(run.code, 1, "{}", run.transcript());
        assert!(
            run.stderr.contains("past any date the service accepts"),
            "{}",
            run.transcript()
        );
    }
    let run = s
        .blazar(&[
            "lease-offers",
            "--within",
            "20000000w",
            "--physical-reservation",
            ONE_HOST,
            "--duration",
            "1h",
        ])
        .await;
    assert_eq!(run.code, 1, "{}", run.transcript());
}
