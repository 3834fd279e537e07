//! Starting in each authentication mode: noauth's guard rails, Keystone settings that are
//! missing or a Keystone that is down.

use std::sync::Arc;

use blazar_server::auth::Auth;
use blazar_server::config::Secret;
use blazar_server::keystone::{Keystone, KeystoneSettings};
use blazar_server::policy::Policy;
use blazar_service::SystemClock;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::harness::TestDatabase;
use crate::matrix::AuthApp;
use crate::support::{ServerProcess, blazar_server, free_port};

#[tokio::test]
async fn noauth_refuses_to_serve_beyond_loopback_without_the_flag() {
    let db = TestDatabase::new().await;
    let out = blazar_server(&[
        "--listen",
        &format!("0.0.0.0:{}", free_port()),
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains("refusing to serve without authentication")
            && out.stderr.contains("--insecure-noauth"),
        "{}",
        out.stderr
    );
    // Nothing was touched: the refusal comes before the database is opened.
    let sqlite_file = db.url.strip_prefix("sqlite://").map(std::path::Path::new);
    if let Some(file) = sqlite_file {
        assert!(!file.exists(), "{file:?}");
    }
}

#[tokio::test]
async fn noauth_warns_at_every_start() {
    let db = TestDatabase::new().await;
    for _ in 0..2 {
        let server = ServerProcess::start(&[
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--database-url",
            &db.url,
        ])
        .await;
        let logs = server.stop().await;
        let warning = logs
            .lines()
            .position(|l| l.contains("WARN") && l.contains("authentication is off (noauth)"));
        let ready = logs.lines().position(|l| l.contains("blazar-server ready"));
        assert!(
            matches!((warning, ready), (Some(w), Some(r)) if w < r),
            "{logs}"
        );
        assert!(
            logs.contains("auth=\"noauth\"") || logs.contains("auth=noauth"),
            "{logs}"
        );
    }
}

#[tokio::test]
async fn keystone_mode_needs_its_settings() {
    let out = blazar_server(&[
        "--auth",
        "keystone",
        "--keystone-url",
        "http://127.0.0.1:1/v3",
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--database-url",
        &TestDatabase::new().await.url,
    ])
    .await;
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains("auth = keystone needs keystone_username, keystone_password"),
        "{}",
        out.stderr
    );
}

fn unreachable_keystone() -> (Arc<Keystone>, String) {
    // A port nothing listens on: connections are refused at once.
    let url = format!("http://127.0.0.1:{}/v3", free_port());
    let keystone = Keystone::new(
        KeystoneSettings {
            auth_url: url.clone(),
            username: "blazar".into(),
            password: Secret::new("unused"),
            user_domain_name: "Default".into(),
            project_name: "service".into(),
            project_domain_name: "Default".into(),
            cache_size: 10,
            revalidate_after: chrono::Duration::seconds(60),
            timeout: std::time::Duration::from_secs(5),
        },
        Arc::new(SystemClock),
    )
    .unwrap();
    (Arc::new(keystone), url)
}

#[tokio::test]
async fn an_unreachable_keystone_is_a_503_and_a_missing_token_still_a_401() {
    let (keystone, url) = unreachable_keystone();
    let app = AuthApp::spawn(move |_| Auth::Keystone(keystone), Policy::defaults()).await;
    let r = app
        .call(Some("some-token"), Method::GET, "/v1/leases", None, &[])
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(r.body["error"]["code"], 503);
    assert!(r.headers.contains_key("x-openstack-request-id"));
    // No token: refused without asking Keystone, with where to get one.
    let r = app.call(None, Method::GET, "/v1/leases", None, &[]).await;
    r.assert_unauthorized();
    let base = url.trim_end_matches("/v3");
    assert_eq!(
        r.headers["www-authenticate"],
        format!("Keystone uri=\"{base}\"").as_str()
    );
    // Open endpoints stay open.
    let r = app.call(None, Method::GET, "/versions", None, &[]).await;
    assert_eq!(r.status, StatusCode::MULTIPLE_CHOICES);
    assert_eq!(r.body["versions"][0]["id"], json!("v1.0"));
}

#[tokio::test]
async fn a_server_whose_keystone_is_down_still_starts() {
    // Keystone may be restarting when blazar-server starts: it must not crash-loop.
    let db = TestDatabase::new().await;
    let server = ServerProcess::start_with_env(
        &[
            "--auth",
            "keystone",
            "--keystone-url",
            &format!("http://127.0.0.1:{}/v3", free_port()),
            "--keystone-username",
            "blazar",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--database-url",
            &db.url,
        ],
        &[("BLAZAR_KEYSTONE_PASSWORD", "pw-that-must-not-be-logged")],
    )
    .await;
    let logs = server.stop().await;
    assert!(logs.contains("Keystone is not reachable now"), "{logs}");
    assert!(!logs.contains("pw-that-must-not-be-logged"), "{logs}");
}
