//! Running the real `blazar-server` binary: as a server whose log lines are collected, or as
//! a command whose output is returned.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// What a finished command printed.
pub struct Output {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `blazar-server` with `args` to completion (a command, or a start that must fail).
pub async fn blazar_server(args: &[&str]) -> Output {
    blazar_server_with_env(args, &[]).await
}

pub async fn blazar_server_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_blazar-server"));
    command
        .args(args)
        .env_remove("BLAZAR_AUTH")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("blazar-server did not finish within 60 s")
        .expect("run blazar-server");
    Output {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[derive(Clone, Copy, Default)]
struct Progress {
    ready: bool,
    closed_streams: u8,
}

/// A `blazar-server` process whose standard output and error are collected line by line.
pub struct ServerProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

impl ServerProcess {
    /// Starts the server and waits until it logs that it is ready.
    pub async fn start(args: &[&str]) -> ServerProcess {
        Self::start_with_env(args, &[]).await
    }

    pub async fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_blazar-server"))
            .args(args)
            .env_remove("BLAZAR_AUTH")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn blazar-server");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (progress_tx, mut progress) = watch::channel(Progress::default());
        let progress_tx = Arc::new(progress_tx);
        let mut readers = Vec::new();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        for stream in [
            Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(stderr),
        ] {
            let lines = lines.clone();
            let progress_tx = progress_tx.clone();
            readers.push(tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    let ready = line.contains("blazar-server ready");
                    lines.lock().unwrap().push(line);
                    if ready {
                        progress_tx.send_modify(|p| p.ready = true);
                    }
                }
                progress_tx.send_modify(|p| p.closed_streams += 1);
            }));
        }
        let outcome = tokio::time::timeout(
            Duration::from_secs(60),
            progress.wait_for(|p| p.ready || p.closed_streams == 2),
        )
        .await;
        let server = ServerProcess {
            child,
            lines,
            readers,
        };
        match outcome {
            Ok(Ok(p)) if p.ready => server,
            _ => {
                let logs = server.stop().await;
                panic!("blazar-server did not become ready:\n{logs}");
            }
        }
    }

    /// The lines logged so far.
    pub fn logs(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Stops the server and returns everything it printed.
    pub async fn stop(mut self) -> String {
        let _ = self.child.kill().await;
        for reader in self.readers.drain(..) {
            let _ = reader.await;
        }
        self.logs()
    }
}
