//! The HTTP side: one client for the public v1 API of any Blazar-compatible server, acting as
//! the admin or as a member of the benchmark's project.
//!
//! Identity is sent both ways a server may read it: blazar-rs in noauth mode takes the
//! `X-Project-Id`/`X-User-Id`/`X-Roles` headers; the Blazar reference peer strips those and maps
//! an `X-Auth-Token` of the form `peer:<user>:<project>:<roles>` to that identity.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Project whose leases the "lease list for one project" operation reads.
pub const BENCH_PROJECT: &str = "bench-project";
const BENCH_USER: &str = "bench-user";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    Admin,
    /// A member of [`BENCH_PROJECT`].
    Member,
}

#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    /// One base URL per server; requests go to each in turn (replicas on one database).
    bases: Arc<Vec<String>>,
    next: Arc<AtomicUsize>,
}

/// What a request returned: the status and the raw body (parsed only when needed, so that
/// timing a list of 100,000 allocations does not time the driver's JSON parser).
pub struct Reply {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_slice(&self.body).context("response body is not JSON")
    }

    pub fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        text.chars().take(300).collect()
    }

    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }
}

/// The headers that make a request the admin's or the bench project member's.
fn identify(request: reqwest::RequestBuilder, who: Who) -> reqwest::RequestBuilder {
    match who {
        Who::Admin => request.header("X-Auth-Token", "admin"),
        Who::Member => request
            .header(
                "X-Auth-Token",
                format!("peer:{BENCH_USER}:{BENCH_PROJECT}:member"),
            )
            .header("X-Project-Id", BENCH_PROJECT)
            .header("X-User-Id", BENCH_USER)
            .header("X-Roles", "member"),
    }
}

impl Api {
    /// `fresh_connections` opens a new TCP connection per request, as python-blazarclient does
    /// against Blazar (whose WSGI server answers `Connection: close`); otherwise connections
    /// are kept alive and reused.
    /// `urls` is one base URL or several separated by commas: replicas of one service,
    /// which the requests are spread over in turn.
    pub fn new(urls: &str, fresh_connections: bool, timeout: Duration) -> anyhow::Result<Api> {
        let mut bases = Vec::new();
        for base in urls.split(',').map(str::trim).filter(|b| !b.is_empty()) {
            let url = reqwest::Url::parse(base).with_context(|| format!("parsing --url {base}"))?;
            let host = url.host_str().unwrap_or_default();
            let loopback = host == "localhost"
                || host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                bail!("blazar-bench only targets loopback servers, not {base}");
            }
            bases.push(base.trim_end_matches('/').to_string());
        }
        if bases.is_empty() {
            bail!("--url names no server");
        }
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .tcp_nodelay(true);
        builder = if fresh_connections {
            builder.pool_max_idle_per_host(0)
        } else {
            builder.pool_max_idle_per_host(256)
        };
        Ok(Api {
            http: builder.build().context("building the HTTP client")?,
            bases: Arc::new(bases),
            next: Arc::new(AtomicUsize::new(0)),
        })
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        who: Who,
        body: Option<&Value>,
    ) -> anyhow::Result<Reply> {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.bases.len();
        let url = format!("{}/v1{path}", self.bases[turn]);
        let mut request = self
            .http
            .request(method.clone(), &url)
            .header("Accept", "application/json")
            .header("User-Agent", "blazar-bench");
        request = identify(request, who);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .with_context(|| format!("reading the body of {method} {path}"))?
            .to_vec();
        Ok(Reply { status, body })
    }

    /// A measured read: the body is read to its end as it arrives and dropped, as `curl -o
    /// /dev/null` does, so the time is the server's answer and not the driver gathering and
    /// copying tens of megabytes on the same cores. Returns the body's length.
    pub async fn read_through(&self, path: &str, who: Who, what: &str) -> Result<usize, String> {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.bases.len();
        let url = format!("{}/v1{path}", self.bases[turn]);
        let request = self
            .http
            .get(&url)
            .header("Accept", "application/json")
            .header("User-Agent", "blazar-bench");
        let mut response = identify(request, who)
            .send()
            .await
            .map_err(|e| format!("GET {path}: {e:#}"))?;
        let status = response.status();
        let mut length = 0;
        let mut head = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("reading the body of GET {path}: {e:#}"))?
        {
            length += chunk.len();
            if !status.is_success() && head.len() < 300 {
                head.extend_from_slice(&chunk);
            }
        }
        if status.is_success() {
            Ok(length)
        } else {
            let reply = Reply { status, body: head };
            Err(format!("{what}{} {}", status, reply.text()))
        }
    }

    pub async fn get(&self, path: &str, who: Who) -> anyhow::Result<Reply> {
        self.call(Method::GET, path, who, None).await
    }

    /// A measured request: its reply if it succeeded, else the failure as a phase records
    /// it (an error status after `what`).
    pub async fn call_ok(
        &self,
        method: Method,
        path: &str,
        who: Who,
        body: Option<&Value>,
        what: &str,
    ) -> Result<Reply, String> {
        let reply = self
            .call(method, path, who, body)
            .await
            .map_err(|e| format!("{e:#}"))?;
        if reply.is_success() {
            Ok(reply)
        } else {
            Err(format!("{what}{} {}", reply.status, reply.text()))
        }
    }
}
