//! `blazar timeline`: the Gantt chart fits the width it is given and explains itself; the
//! machine formats carry the server's timeline.

use crate::harness::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gantt_chart_fits_the_width_and_has_a_legend() {
    let s = Server::start().await;
    for args in [
        &["host-create", "--extra", "vcpus=4", "compute-1"][..],
        &["host-create", "--extra", "vcpus=4", "compute-2"],
        &["host-create", "a-host-with-a-very-long-name-indeed"],
        &[
            "host-update",
            "--extra",
            "reservable=false",
            "a-host-with-a-very-long-name-indeed",
        ],
        &[
            "lease-create",
            "--physical-reservation",
            r#"min=1,max=1,hypervisor_properties=,resource_properties=["==", "$hypervisor_hostname", "compute-1"]"#,
            "--start-date",
            "2030-01-01 06:00",
            "--end-date",
            "2030-01-01 12:00",
            "whole",
        ],
        &[
            "lease-create",
            "--reservation",
            r#"resource_type=virtual:instance,amount=1,vcpus=1,memory_mb=512,disk_gb=5,affinity=False,resource_properties=["==", "$hypervisor_hostname", "compute-2"]"#,
            "--start-date",
            "2030-01-01 12:00",
            "--end-date",
            "2030-01-01 18:00",
            "slots",
        ],
    ] {
        s.blazar(args).await.ok();
    }
    let window = [
        "timeline",
        "host",
        "--start",
        "2030-01-01 00:00",
        "--end",
        "2030-01-02 00:00",
        "--utc",
    ];
    let run = s
        .blazar_with(&window, &[("BLAZAR_URL", &s.base), ("COLUMNS", "60")])
        .await;
    let text = run.ok();
    let lines: Vec<&str> = text.lines().collect();
    for line in &lines {
        assert!(
            line.chars().count() <= 60,
            "{line:?} is wider than 60:\n{text}"
        );
    }
    assert_eq!(lines[0], "2030-01-01 00:00 to 2030-01-02 00:00 (UTC)");
    assert!(lines[1].trim_start().starts_with("01-01 00:00"), "{text}");
    // 60 columns: a name column of 24, " |", 33 buckets of 43 minutes 38 s, "|"; a bucket
    // shows what touches any part of it.
    let row = |name: &str| -> String {
        let line = lines.iter().find(|l| l.starts_with(name)).unwrap();
        line.split('|').nth(1).unwrap().to_string()
    };
    let whole = row("compute-1 ");
    assert_eq!(whole.chars().count(), 33, "{text}");
    assert_eq!(
        whole,
        format!("{}{}{}", ".".repeat(8), "=".repeat(9), ".".repeat(16))
    );
    let slots = row("compute-2 ");
    assert_eq!(
        slots,
        format!("{}{}{}", ".".repeat(16), "+".repeat(9), ".".repeat(8))
    );
    let maintenance = row("a-host-with-a-very-long~");
    assert_eq!(maintenance, "x".repeat(33));
    let first = lines
        .iter()
        .position(|l| l.starts_with("legend: "))
        .unwrap();
    let legend: String = lines[first..].join("\n");
    for entry in [
        ". free",
        "= your project's lease",
        "# another project's lease",
        "+ instance slots partly used",
        "x not reservable",
        "one column: 43m 38s",
    ] {
        assert!(legend.contains(entry), "{entry} missing from\n{text}");
    }

    // Wider terminals give more buckets; --width wins over COLUMNS.
    let run = s
        .blazar_with(
            &[&window[..], &["--width", "120"]].concat(),
            &[("BLAZAR_URL", &s.base), ("COLUMNS", "60")],
        )
        .await;
    let wide = run.ok();
    assert!(wide.lines().all(|l| l.chars().count() <= 120), "{wide}");
    assert!(wide.lines().any(|l| l.chars().count() == 120), "{wide}");
    // A width out of reason is refused by the command line, not attempted.
    for width in ["0", "99999999999"] {
        let run = s
            .blazar_with(
                &[&window[..], &["--width", width]].concat(),
                &[("BLAZAR_URL", &s.base)],
            )
            .await;
        assert_ne!(run.code, 0, "{}", run.transcript());
        assert!(run.stderr.contains("--width"), "{}", run.transcript());
    }

    // JSON is the server's timeline.
    let run = s.blazar(&[&window[..], &["-f", "json"]].concat()).await;
    let json: serde_json::Value = serde_json::from_str(run.ok()).unwrap();
    assert_eq!(json["resource_type"], "physical:host");
    assert_eq!(json["resources"].as_array().unwrap().len(), 3);
    assert_eq!(json["resources"][0]["busy"][0]["lease_name"], "whole");

    // A bad query is the server's 400.
    let run = s
        .blazar(&[
            "timeline",
            "host",
            "--query",
            r#"["==", "$colour", "blue"]"#,
        ])
        .await;
    assert_eq!(run.code, 1, "{}", run.transcript());
    assert!(
        run.stderr.contains("Unknown property $colour in query"),
        "{}",
        run.transcript()
    );
}
