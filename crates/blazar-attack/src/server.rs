//! Starting, probing and killing real `blazar-server` processes.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// How to start a server: the binary, the database, and options after them.
#[derive(Clone, Debug)]
pub struct Launch {
    pub binary: PathBuf,
    pub database_url: String,
    pub args: Vec<String>,
    /// Soft and hard open-file limit of the server process (`ulimit -n`), as on a default host.
    pub nofile: Option<u64>,
    /// Where the server's log goes (appended).
    pub log: PathBuf,
}

pub struct Server {
    child: Child,
    pub base: String,
}

pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(listener.local_addr()?.port())
}

impl Server {
    /// Starts the server on `port` and waits until `/healthz` answers.
    pub async fn start(launch: &Launch, port: u16) -> anyhow::Result<Server> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&launch.log)
            .with_context(|| format!("opening {}", launch.log.display()))?;
        let listen = format!("127.0.0.1:{port}");
        let mut argv: Vec<String> = vec![
            launch.binary.display().to_string(),
            "--listen".into(),
            listen.clone(),
            "--database-url".into(),
            launch.database_url.clone(),
        ];
        argv.extend(launch.args.iter().cloned());
        // `ulimit` is a shell builtin: a shell sets the limit and then becomes the server, so
        // the pid is the server's own.
        let mut command = match launch.nofile {
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -Sn {n} && ulimit -Hn {n} && exec \"$@\""))
                    .arg("sh")
                    .args(&argv);
                c
            }
            None => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env("BLAZAR_LOG", "warn")
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", launch.binary.display()))?;
        let mut server = Server {
            child,
            base: format!("http://{listen}"),
        };
        server.wait_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    async fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the server exited during start-up ({status})");
            }
            if let Ok(r) = client.get(format!("{}/healthz", self.base)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the server did not answer /healthz within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, as a crash or an OOM kill would end it, and reap it.
    pub async fn kill9(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("killing the server")
    }
}

pub fn rss_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .context("malformed VmRSS line")?
        .parse()
        .context("malformed VmRSS value")?;
    Ok(kb * 1024)
}

/// A SQLite database URL for a fresh file in `dir`.
pub fn sqlite_url(dir: &Path, name: &str) -> String {
    format!("sqlite://{}", dir.join(name).display())
}

pub fn http_client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(64)
        .build()?)
}
