//! A real blazar-server from the test kit (`blazar-testkit`: built as production builds it,
//! on its own database and a clock the test moves), and the real `blazar` binary run against
//! it as a user would run it.

use std::sync::Arc;

use blazar_service::ManualClock;
use blazar_testkit::TestApp;
use chrono::{DateTime, Utc};

pub use blazar_testkit::epoch;

pub struct Server {
    /// `http://127.0.0.1:PORT`, without `/v1`.
    pub base: String,
    pub clock: Arc<ManualClock>,
    /// The HOME and working directory of every `blazar` run: no clouds.yaml of the
    /// developer's leaks in.
    pub home: tempfile::TempDir,
    app: TestApp,
}

/// One run of the binary.
#[derive(Debug)]
pub struct Run {
    pub args: Vec<String>,
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl Run {
    /// The run as the Python client's transcript shows one: command, stdout, stderr, exit
    /// code; what the snapshots store.
    pub fn transcript(&self) -> String {
        let mut text = format!("$ blazar {}\n{}", shell_words(&self.args), self.stdout);
        if !self.stderr.is_empty() {
            text.push_str("--- stderr ---\n");
            text.push_str(&self.stderr);
        }
        text.push_str(&format!("[exit {}]\n", self.code));
        text
    }

    /// Asserts success and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "{}", self.transcript());
        &self.stdout
    }
}

fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if a.is_empty() || a.contains([' ', '"', '[', ']', '$']) {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Server {
    pub async fn start() -> Server {
        let app = TestApp::builder().max_connections(4).spawn().await;
        Server {
            base: app.base.clone(),
            clock: app.clock.clone(),
            home: tempfile::tempdir().expect("home dir"),
            app,
        }
    }

    /// Runs `blazar ARGS` with `BLAZAR_URL` pointing here, in UTC, nothing else from the
    /// environment.
    pub async fn blazar(&self, args: &[&str]) -> Run {
        self.blazar_with(args, &[("BLAZAR_URL", &self.base)]).await
    }

    /// Runs `blazar ARGS` with exactly `env` (plus TZ=UTC and a private HOME).
    pub async fn blazar_with(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let run = run_blazar(args, env, self.home.path()).await;
        // What the server's workers do right after a commit, done before the test looks.
        self.app.run_actions().await;
        run
    }

    /// Delivers the webhook deliveries due, as the server's deliverer would.
    pub async fn deliver_webhooks(&self) -> blazar_service::DeliveryReport {
        let poster = blazar_openstack::WebhookPoster::new(true).expect("webhook client");
        self.app
            .service
            .deliver_webhooks(&poster)
            .await
            .expect("deliver webhooks")
    }

    /// Moves the clock to `t` and runs the events due then.
    pub async fn tick_at(&self, t: DateTime<Utc>) {
        self.app.tick_at(t).await;
    }
}

/// `--physical-reservation` of any one host.
pub const ONE_HOST: &str = "min=1,max=1,hypervisor_properties=,resource_properties=";

/// The `lease-create` arguments most tests start from: lease `name` of any one host on
/// 2030-01-01, 10:00 to 12:00 UTC, with `options` before the name.
pub fn one_host_lease<'a>(name: &'a str, options: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "lease-create",
        "--physical-reservation",
        ONE_HOST,
        "--start-date",
        "2030-01-01 10:00",
        "--end-date",
        "2030-01-01 12:00",
    ];
    args.extend(options);
    args.push(name);
    args
}

pub async fn run_blazar(args: &[&str], env: &[(&str, &str)], home: &std::path::Path) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_blazar"));
    command
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("TZ", "UTC")
        .current_dir(home)
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().await.expect("run blazar");
    Run {
        args: args.iter().map(|a| a.to_string()).collect(),
        stdout: String::from_utf8(output.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("utf-8 stderr"),
        code: output.status.code().unwrap_or(-1),
    }
}

/// Snapshot settings: ids and trust ids vary per run and are replaced by placeholders of
/// the same width, so tables stay aligned; everything else is fixed by the clock.
pub fn redactions() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
    );
    settings.add_filter(r"\b[0-9a-f]{32}\b", "x".repeat(32));
    settings.add_filter(r"127\.0\.0\.1:[0-9]+", "127.0.0.1:PORT");
    settings.set_prepend_module_to_snapshot(false);
    settings
}

/// Snapshots a sequence of runs as one transcript.
#[macro_export]
macro_rules! assert_transcript {
    ($name:expr, $runs:expr) => {{
        let text: String = $runs.iter().map(|r| r.transcript() + "\n").collect();
        $crate::harness::redactions().bind(|| insta::assert_snapshot!($name, text));
    }};
}
