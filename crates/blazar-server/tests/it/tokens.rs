//! Auth mode `tokens`: standalone tokens made by `blazar-server token create`, stored as
//! digests, checked on every request, revocable at once.

use std::sync::Arc;

use blazar_server::auth::Auth;
use blazar_server::policy::Policy;
use blazar_server::tokens::{self, NewToken, TokenAuth};
use blazar_service::ManualClock;
use chrono::{Duration, Utc};
use reqwest::{Method, StatusCode};

use crate::harness::TestDatabase;
use crate::matrix::{Actor, AuthApp, Cast, run_policy_matrix};
use crate::support::{ServerProcess, blazar_server, free_port};

async fn actor(app: &AuthApp, name: &str, project: &str, role: &str) -> Actor {
    let issued = tokens::issue(
        &app.store,
        NewToken {
            project_id: project.into(),
            user_id: Some(name.into()),
            roles: vec![role.into()],
            description: String::new(),
            expires_at: None,
        },
        Utc::now(),
    )
    .await
    .unwrap();
    Actor {
        name: name.into(),
        token: issued.token,
        user_id: name.into(),
        project_id: project.into(),
    }
}

fn tokens_app_auth(clock: Arc<ManualClock>) -> impl FnOnce(&blazar_db::Store) -> Auth {
    move |store| Auth::tokens(TokenAuth::new(store.clone(), clock))
}

#[tokio::test]
async fn standalone_tokens_pass_the_policy_matrix() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = AuthApp::spawn(tokens_app_auth(clock), Policy::defaults()).await;
    let cast = Cast {
        alpha_admin: actor(&app, "alpha-admin", "alpha", "admin").await,
        alpha_member: actor(&app, "alpha-member", "alpha", "member").await,
        alpha_reader: actor(&app, "alpha-reader", "alpha", "reader").await,
        beta_admin: actor(&app, "beta-admin", "beta", "admin").await,
        beta_member: actor(&app, "beta-member", "beta", "member").await,
        beta_reader: actor(&app, "beta-reader", "beta", "reader").await,
    };
    run_policy_matrix(&app, &cast).await;
}

#[tokio::test]
async fn only_a_digest_of_the_secret_is_stored() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = AuthApp::spawn(tokens_app_auth(clock), Policy::defaults()).await;
    let issued = actor(&app, "u", "p", "member").await;
    let (id, secret) = tokens::split(&issued.token).expect("token shape");
    let rows = tokens::list(&app.store).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, id);
    assert_eq!(rows[0].secret_sha256, tokens::digest(secret));
    // No stored field holds the secret.
    let stored = format!("{:?}", rows[0]);
    assert!(!stored.contains(secret), "{stored}");
    // Tokens are unguessable and distinct.
    let other = actor(&app, "u", "p", "member").await;
    assert_ne!(other.token, issued.token);
    assert_eq!(secret.len(), 64);
}

#[tokio::test]
async fn expired_revoked_and_forged_tokens_are_refused() {
    let now = Utc::now();
    let clock = Arc::new(ManualClock::new(now));
    let app = AuthApp::spawn(tokens_app_auth(clock.clone()), Policy::defaults()).await;
    let expiring = tokens::issue(
        &app.store,
        NewToken {
            project_id: "p".into(),
            user_id: None,
            roles: vec!["member".into()],
            description: "expires".into(),
            expires_at: Some(now + Duration::hours(1)),
        },
        now,
    )
    .await
    .unwrap();
    let get = |token: String| {
        let app = &app;
        async move {
            app.call(Some(&token), Method::GET, "/v1/leases", None, &[])
                .await
        }
    };
    get(expiring.token.clone())
        .await
        .assert_status(StatusCode::OK);
    assert_eq!(expiring.row.user_id, format!("token-{}", expiring.row.id));
    clock.set(now + Duration::hours(1));
    get(expiring.token.clone()).await.assert_unauthorized();

    let kept = actor(&app, "u", "p", "member").await;
    get(kept.token.clone()).await.assert_status(StatusCode::OK);
    // The right id with another secret is refused, as is a secret with another id.
    let (id, secret) = tokens::split(&kept.token).unwrap();
    let forged = format!("blz_{id}_{}", "0".repeat(64));
    get(forged).await.assert_unauthorized();
    let other_id = format!("blz_{}_{secret}", "0".repeat(16));
    get(other_id).await.assert_unauthorized();
    // Two tokens in one request name nobody, whichever comes first.
    let other = actor(&app, "v", "q", "member").await;
    for (first, second) in [(&kept.token, &other.token), (&other.token, &kept.token)] {
        app.call(
            Some(first),
            Method::GET,
            "/v1/leases",
            None,
            &[("X-Auth-Token", second.as_str())],
        )
        .await
        .assert_unauthorized();
    }
    // Revocation takes effect on the next request.
    assert!(tokens::revoke(&app.store, id, Utc::now()).await.unwrap());
    get(kept.token.clone()).await.assert_unauthorized();
    // Revoking twice, or an unknown token, reports nothing was revoked.
    assert!(
        !tokens::revoke(&app.store, &kept.token, Utc::now())
            .await
            .unwrap()
    );
    assert!(
        !tokens::revoke(&app.store, "nope", Utc::now())
            .await
            .unwrap()
    );
}

/// A server in tokens mode that checks a token again after a second.
async fn rechecking_tokens_app() -> crate::harness::TestApp {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    crate::harness::TestApp::builder()
        .auth_with(tokens_app_auth(clock))
        .configure(|cli| cli.token_revalidate_seconds = Some(1))
        .spawn()
        .await
}

/// An open event stream is held to what a request is: revoking its token ends it within the
/// revalidation interval, and the client cannot open it again with that token.
#[tokio::test]
async fn revoking_a_token_ends_its_open_event_stream() {
    let app = rechecking_tokens_app().await;
    let issue = || {
        tokens::issue(
            app.store(),
            NewToken {
                project_id: "p".into(),
                user_id: None,
                roles: vec!["member".into()],
                description: String::new(),
                expires_at: None,
            },
            Utc::now(),
        )
    };
    let (revoked, kept) = (issue().await.unwrap(), issue().await.unwrap());
    let open = |token: String| {
        app.client
            .get(format!("{}/v1/leases/events", app.base))
            .header("X-Auth-Token", token)
            .send()
    };
    let mut doomed = open(revoked.token.clone()).await.unwrap();
    let mut other = open(kept.token.clone()).await.unwrap();
    assert_eq!(doomed.status(), StatusCode::OK);
    assert_eq!(other.status(), StatusCode::OK);
    assert!(
        tokens::revoke(app.store(), &revoked.row.id, Utc::now())
            .await
            .unwrap()
    );
    // The stream ends (its body completes) well before a keep-alive would have told.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(8), async {
        while doomed.chunk().await.unwrap().is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the revoked token's stream stayed open");
    // The other token's stream is still open.
    let still = tokio::time::timeout(std::time::Duration::from_secs(2), other.chunk()).await;
    assert!(still.is_err(), "the kept token's stream ended: {still:?}");
    let again = open(revoked.token).await.unwrap();
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
}

/// A long poll (`?wait_for`) is held to the same: one that waited past the revalidation
/// interval asks again before it answers, and a token revoked meanwhile gets its 401.
#[tokio::test]
async fn a_long_poll_whose_token_was_revoked_meanwhile_answers_401() {
    let app = rechecking_tokens_app().await;
    let issue = |roles: &[&str]| {
        tokens::issue(
            app.store(),
            NewToken {
                project_id: "p".into(),
                user_id: None,
                roles: roles.iter().map(|r| r.to_string()).collect(),
                description: String::new(),
                expires_at: None,
            },
            Utc::now(),
        )
    };
    let admin = issue(&["admin"]).await.unwrap();
    let host = app
        .client
        .post(format!("{}/v1/os-hosts", app.base))
        .header("X-Auth-Token", &admin.token)
        .json(&serde_json::json!({"name": "compute-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(host.status(), StatusCode::CREATED);
    let token = issue(&["member"]).await.unwrap();
    let created = app
        .client
        .post(format!("{}/v1/leases", app.base))
        .header("X-Auth-Token", &token.token)
        .json(
            &serde_json::json!({"name": "w", "start_date": "2030-01-01 10:00",
            "end_date": "2030-01-01 12:00", "events": [],
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                "hypervisor_properties": "", "resource_properties": ""}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let lease: serde_json::Value = created.json().await.unwrap();
    let id = lease["lease"]["id"].as_str().unwrap().to_string();
    let poll = app
        .client
        .get(format!(
            "{}/v1/leases/{id}?wait_for=ACTIVE&timeout=3",
            app.base
        ))
        .header("X-Auth-Token", &token.token)
        .send();
    let revoke = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert!(
            tokens::revoke(app.store(), &token.row.id, Utc::now())
                .await
                .unwrap()
        );
    };
    let (answer, ()) = tokio::join!(poll, revoke);
    assert_eq!(answer.unwrap().status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_cli_manages_tokens_of_a_running_server_and_no_token_reaches_the_logs() {
    let db = TestDatabase::new().await;
    let port = free_port();
    let server = ServerProcess::start(&[
        "--auth",
        "tokens",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--database-url",
        &db.url,
        // Everything, libraries included, so that a token in any log line would show.
        "--log",
        "trace",
    ])
    .await;
    let base = format!("http://127.0.0.1:{port}");

    let created = blazar_server(&[
        "token",
        "create",
        "--project",
        "demo",
        "--role",
        "member",
        "--description",
        "made by the test",
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(created.status.success(), "{}", created.stderr);
    let token = created.stdout.trim().to_string();
    let (id, secret) = tokens::split(&token).expect("stdout is the token alone");
    assert!(created.stderr.contains(id), "{}", created.stderr);
    assert!(!created.stderr.contains(secret), "{}", created.stderr);

    let client = reqwest::Client::new();
    let get = |token: &str| {
        client
            .get(format!("{base}/v1/leases"))
            .header("X-Auth-Token", token)
            .send()
    };
    assert_eq!(get(&token).await.unwrap().status(), StatusCode::OK);
    let r = client
        .post(format!("{base}/v1/leases"))
        .header("X-Auth-Token", &token)
        .json(
            &serde_json::json!({"name": "x", "start_date": "2030-01-01 10:00",
                                  "end_date": "2030-01-01 12:00", "reservations": []}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let lease: serde_json::Value = r.json().await.unwrap();
    assert_eq!(lease["lease"]["project_id"], "demo");
    assert_eq!(
        get("blz_0000000000000000_nothing").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );

    let listed = blazar_server(&["token", "list", "--database-url", &db.url]).await;
    assert!(listed.status.success(), "{}", listed.stderr);
    let row = listed
        .stdout
        .lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("{}", listed.stdout));
    for expected in ["demo", "member", "active", "never", "made by the test"] {
        assert!(row.contains(expected), "{row}");
    }
    assert!(!listed.stdout.contains(secret));

    let revoked = blazar_server(&["token", "revoke", id, "--database-url", &db.url]).await;
    assert!(revoked.status.success(), "{}", revoked.stderr);
    // The running server refuses it on the very next request.
    assert_eq!(
        get(&token).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let listed = blazar_server(&["token", "list", "--database-url", &db.url]).await;
    assert!(
        listed
            .stdout
            .lines()
            .any(|l| l.starts_with(id) && l.contains("revoked"))
    );
    let again = blazar_server(&["token", "revoke", id, "--database-url", &db.url]).await;
    assert!(!again.status.success());
    assert!(again.stderr.contains("no active token"), "{}", again.stderr);
    // A token needs a role.
    let no_role = blazar_server(&[
        "token",
        "create",
        "--project",
        "p",
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(!no_role.status.success());

    let logs = server.stop().await;
    assert!(logs.contains("blazar-server ready"), "{logs}");
    assert!(
        logs.contains("/v1/leases"),
        "the trace logs show the requests: {logs}"
    );
    assert!(!logs.contains(secret), "the token's secret is in the logs");
    assert!(!logs.contains(&token));
}
