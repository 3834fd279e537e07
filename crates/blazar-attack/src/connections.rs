//! Connection exhaustion: one client holds more idle and "slowloris" connections than the
//! server may keep (reopening whatever the server closes, as an attacker would), while another
//! client must still be served promptly the whole time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct ConnConfig {
    pub addr: String,
    pub idle: usize,
    pub slow: usize,
    pub hold: Duration,
    pub probe_timeout: Duration,
}

#[derive(Debug, Default)]
pub struct ConnReport {
    pub probes: usize,
    pub probe_failures: Vec<String>,
    pub slowest_probe: Duration,
    /// Connections the server closed (and the attacker reopened).
    pub closed_by_server: usize,
    /// Connections the attacker could not open at all.
    pub refused: usize,
}

/// Holds one connection until `until`: idle, or sending one header byte every 5 s. Reopens it
/// whenever the server closes it.
async fn hold(
    addr: String,
    slow: bool,
    until: Instant,
    closed: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) {
    let mut first = true;
    while Instant::now() < until {
        // Reconnect after a pause: an attacker spinning on reconnects measures the machine.
        if !first {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        first = false;
        let Ok(mut stream) = TcpStream::connect(&addr).await else {
            refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if slow
            && stream
                .write_all(b"GET /v1/leases HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .is_err()
        {
            continue;
        }
        let mut buf = [0u8; 256];
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let tick = left.min(Duration::from_secs(5));
            match tokio::time::timeout(tick, stream.read(&mut buf)).await {
                // Nothing from the server: still held. A slow client sends one more byte.
                Err(_) => {
                    if slow && stream.write_all(b"a").await.is_err() {
                        closed.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Ok(Ok(_)) => {}
            }
        }
    }
}

pub async fn run(config: ConnConfig, log: &dyn Fn(&str)) -> anyhow::Result<ConnReport> {
    let until = Instant::now() + config.hold;
    let closed = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut holders = Vec::new();
    for i in 0..config.idle + config.slow {
        holders.push(tokio::spawn(hold(
            config.addr.clone(),
            i >= config.idle,
            until,
            closed.clone(),
            refused.clone(),
        )));
        // Open them quickly, but not as one burst larger than the listen backlog.
        if i % 64 == 63 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    log(&format!(
        "connections: holding {} idle and {} slow connections for {:?}",
        config.idle, config.slow, config.hold
    ));
    let mut report = ConnReport::default();
    // A fresh client per probe: a new connection must get a slot, not reuse an old one.
    while Instant::now() < until {
        for path in ["/healthz", "/v1/leases"] {
            let client = reqwest::Client::builder()
                .timeout(config.probe_timeout)
                .pool_max_idle_per_host(0)
                .build()?;
            let started = Instant::now();
            report.probes += 1;
            match client
                .get(format!("http://{}{path}", config.addr))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => {
                    report.slowest_probe = report.slowest_probe.max(started.elapsed());
                }
                Ok(r) => report.probe_failures.push(format!(
                    "{path}: {} after {:?}",
                    r.status(),
                    started.elapsed()
                )),
                Err(e) => report
                    .probe_failures
                    .push(format!("{path}: {e} after {:?}", started.elapsed())),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for h in holders {
        let _ = h.await;
    }
    report.closed_by_server = closed.load(Ordering::Relaxed);
    report.refused = refused.load(Ordering::Relaxed);
    Ok(report)
}
