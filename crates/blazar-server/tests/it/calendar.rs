//! `/calendar`: the page and its assets with their content types and security headers, open
//! in every auth mode (the data calls are what need a token), and the Keystone sign-in
//! exchange against a stand-in Keystone on loopback.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::post;
use blazar_server::auth::Auth;
use blazar_server::config::Secret;
use blazar_server::keystone::{Keystone, KeystoneSettings};
use blazar_server::tokens::TokenAuth;
use blazar_service::SystemClock;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::TestApp;
use crate::support::free_port;

async fn get(app: &TestApp, path: &str) -> (StatusCode, HeaderMap, String) {
    let resp = app
        .client
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    (status, headers, resp.text().await.unwrap())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_default()
}

#[track_caller]
fn assert_secure(headers: &HeaderMap) {
    let csp = header(headers, "content-security-policy");
    let script_src = csp
        .split(';')
        .map(str::trim)
        .find(|d| d.starts_with("script-src"))
        .unwrap_or_else(|| panic!("no script-src in {csp:?}"));
    assert_eq!(script_src, "script-src 'self'", "{csp}");
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    assert_eq!(header(headers, "x-content-type-options"), "nosniff");
    assert_eq!(header(headers, "x-frame-options"), "DENY");
    assert_eq!(header(headers, "referrer-policy"), "no-referrer");
    assert!(headers.get("set-cookie").is_none());
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_with_their_types_and_security_headers() {
    let app = TestApp::spawn().await;
    let (status, headers, body) = get(&app, "/calendar").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "content-type"), "text/html; charset=utf-8");
    assert_secure(&headers);
    assert!(body.contains(r#"<meta name="blazar-auth-mode" content="noauth">"#));
    // Every script is a file of the server's: no inline code for the policy to allow.
    for (i, tag) in body.match_indices("<script").map(|(i, _)| i).enumerate() {
        let end = body[tag..].find('>').unwrap() + tag;
        assert!(body[tag..end].contains(r#"src="calendar/"#), "script {i}");
        assert!(
            body[end..].starts_with("></script>"),
            "script {i} has a body"
        );
    }
    let handlers = body.split(" on").skip(1).filter(|rest| {
        let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
        !name.is_empty() && rest[name.len()..].starts_with('=')
    });
    assert_eq!(handlers.count(), 0, "no inline event handlers");

    let assets = [
        ("/calendar/app.js", "text/javascript; charset=utf-8"),
        ("/calendar/api.js", "text/javascript; charset=utf-8"),
        ("/calendar/gantt.js", "text/javascript; charset=utf-8"),
        ("/calendar/panels.js", "text/javascript; charset=utf-8"),
        ("/calendar/time.js", "text/javascript; charset=utf-8"),
        ("/calendar/style.css", "text/css; charset=utf-8"),
        ("/calendar/icon.svg", "image/svg+xml"),
    ];
    for (path, content_type) in assets {
        let (status, headers, body) = get(&app, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(header(&headers, "content-type"), content_type, "{path}");
        assert_secure(&headers);
        assert!(!body.is_empty(), "{path}");
        // Nothing from another origin: the page works on an offline network.
        assert!(!body.contains("https://"), "{path} names another origin");
        // Revalidated on each load: 304 while the server's copy is the one held.
        let etag = header(&headers, "etag").to_string();
        assert!(etag.starts_with('"'), "{path}: {etag:?}");
        let again = app
            .client
            .get(format!("{}{path}", app.base))
            .header("If-None-Match", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
        assert_secure(again.headers());
        assert_eq!(header(again.headers(), "etag"), etag);
        assert!(again.text().await.unwrap().is_empty());
    }
    let (status, _, _) = get(&app, "/calendar/missing.js").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The trailing-slash spelling leads to the page (whose relative asset paths need it).
    let resp = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/calendar/", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(header(resp.headers(), "location"), "/calendar");
    // Sign-in exchanges credentials with Keystone only.
    let r = app
        .post(
            "/calendar/api/sign-in",
            json!({"username": "u", "password": "p", "project": "x"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
}

#[tokio::test]
async fn in_tokens_mode_the_page_is_open_and_the_data_is_not() {
    let app = TestApp::builder()
        .auth_with(|store| Auth::tokens(TokenAuth::new(store.clone(), Arc::new(SystemClock))))
        .spawn()
        .await;
    let (status, headers, body) = get(&app, "/calendar").await;
    assert_eq!(status, StatusCode::OK);
    assert_secure(&headers);
    assert!(body.contains(r#"<meta name="blazar-auth-mode" content="tokens">"#));
    let (status, _, _) = get(&app, "/calendar/app.js").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = get(&app, "/v1/os-hosts/timeline").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// A stand-in for Keystone's `POST /v3/auth/tokens`: user `ada` with password `right` in
/// project `lab` gets a token; anything else is Keystone's 401.
async fn fake_keystone() -> String {
    async fn tokens(body: axum::Json<Value>) -> axum::response::Response {
        use axum::response::IntoResponse;
        let auth = &body["auth"];
        let user = &auth["identity"]["password"]["user"];
        let scope = &auth["scope"]["project"];
        let right = user["name"] == "ada"
            && user["password"] == "right"
            && user["domain"]["name"] == "Default"
            && scope["name"] == "lab";
        if !right {
            return (
                AxumStatus::UNAUTHORIZED,
                axum::Json(json!({"error": {"code": 401, "title": "Unauthorized",
                                            "message": "The request you have made requires authentication."}})),
            )
                .into_response();
        }
        (
            AxumStatus::CREATED,
            [("x-subject-token", "gAAAA-user-token")],
            axum::Json(json!({"token": {
                "expires_at": "2099-01-01T00:00:00.000000Z",
                "user": {"id": "u-ada", "name": "ada", "domain": {"id": "default"}},
                "project": {"id": "p-lab", "name": "lab", "domain": {"id": "default"}},
                "roles": [{"name": "member"}, {"name": "reader"}],
            }})),
        )
            .into_response()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v3", listener.local_addr().unwrap());
    let router = axum::Router::new().route("/v3/auth/tokens", post(tokens));
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

fn keystone_at(url: &str) -> Keystone {
    Keystone::new(
        KeystoneSettings {
            auth_url: url.to_string(),
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
    .unwrap()
}

#[tokio::test]
async fn keystone_sign_in_exchanges_credentials_for_the_users_token() {
    let url = fake_keystone().await;
    let keystone = keystone_at(&url);
    let app = TestApp::builder()
        .auth_with(move |_| Auth::keystone(keystone))
        .spawn()
        .await;
    let (_, _, page) = get(&app, "/calendar").await;
    assert!(page.contains(r#"content="keystone""#));

    let sign_in = |body: Value| {
        let client = app.client.clone();
        let url = format!("{}/calendar/api/sign-in", app.base);
        async move { client.post(url).json(&body).send().await.unwrap() }
    };
    let resp = sign_in(json!({"username": "ada", "password": "right", "project": "lab"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(resp.headers(), "cache-control"), "no-store");
    assert!(resp.headers().get("set-cookie").is_none());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["token"], "gAAAA-user-token");
    assert_eq!(body["project"]["id"], "p-lab");
    assert_eq!(body["roles"], json!(["member", "reader"]));

    let resp = sign_in(json!({"username": "ada", "password": "wrong", "project": "lab"})).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body: Value = resp.json().await.unwrap();
    assert!(body.to_string().contains("refused"), "{body}");
    assert!(
        !body.to_string().contains("wrong"),
        "the password is never echoed"
    );

    let resp = sign_in(json!({"username": "ada"})).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    // Keystone away: the page is told to try later, not that the password is wrong.
    let gone = keystone_at(&format!("http://127.0.0.1:{}/v3", free_port()));
    let app = TestApp::builder()
        .auth_with(move |_| Auth::keystone(gone))
        .spawn()
        .await;
    let resp = app
        .client
        .post(format!("{}/calendar/api/sign-in", app.base))
        .json(&json!({"username": "ada", "password": "right", "project": "lab"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
}
