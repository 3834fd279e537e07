//! Auth mode `keystone` against a real Keystone (installed, bootstrapped and served on
//! loopback by `scripts/keystone/test.sh`, which sets the variables below). Without them
//! these tests say so and pass: `cargo test` alone needs no Keystone.

use std::sync::Arc;

use blazar_server::auth::Auth;
use blazar_server::config::Secret;
use blazar_server::keystone::{Keystone, KeystoneSettings};
use blazar_server::policy::Policy;
use blazar_service::ManualClock;
use chrono::{DateTime, Duration, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, TestDatabase};
use crate::matrix::{Actor, AuthApp, Cast, run_policy_matrix};
use crate::support::{ServerProcess, free_port};

/// Where the test Keystone is and how to log in to it.
struct Env {
    /// Identity API, ending in /v3.
    url: String,
    service_user: String,
    service_password: String,
    /// Password of the users alpha-admin, alpha-member, alpha-reader, beta-*.
    user_password: String,
}

fn env() -> Option<Env> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let Some(url) = var("BLAZAR_TEST_KEYSTONE_URL") else {
        eprintln!(
            "skipping: BLAZAR_TEST_KEYSTONE_URL is not set (scripts/keystone/test.sh runs these \
             tests against a real Keystone)"
        );
        return None;
    };
    let required = |name: &str| var(name).unwrap_or_else(|| panic!("{name} is not set"));
    Some(Env {
        url,
        service_user: required("BLAZAR_TEST_KEYSTONE_SERVICE_USER"),
        service_password: required("BLAZAR_TEST_KEYSTONE_SERVICE_PASSWORD"),
        user_password: required("BLAZAR_TEST_KEYSTONE_USER_PASSWORD"),
    })
}

/// A token Keystone issued.
struct Issued {
    token: String,
    user_id: String,
    project_id: String,
    roles: Vec<String>,
    expires_at: DateTime<Utc>,
    /// The whole token body, as Keystone answered.
    body: Value,
}

/// Logs in as `user`, scoped to `project` (or unscoped).
async fn issue(env: &Env, user: &str, project: Option<&str>) -> Issued {
    let scope = project.map(|p| json!({"project": {"name": p, "domain": {"id": "default"}}}));
    login(env, user, &env.user_password, scope).await
}

/// Logs in as `user` with `password`, with `scope` (Keystone's shape) if given.
async fn login(env: &Env, user: &str, password: &str, scope: Option<Value>) -> Issued {
    let mut auth = json!({"identity": {"methods": ["password"], "password": {"user": {
        "name": user, "domain": {"id": "default"}, "password": password,
    }}}});
    if let Some(scope) = scope {
        auth["scope"] = scope;
    }
    let resp = reqwest::Client::new()
        .post(format!("{}/auth/tokens?nocatalog", env.url))
        .json(&json!({ "auth": auth }))
        .send()
        .await
        .expect("Keystone answers");
    assert_eq!(resp.status(), StatusCode::CREATED, "login as {user}");
    let token = resp.headers()["x-subject-token"]
        .to_str()
        .unwrap()
        .to_string();
    let body: Value = resp.json().await.unwrap();
    Issued {
        token,
        user_id: body["token"]["user"]["id"].as_str().unwrap().to_string(),
        project_id: body["token"]["project"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        roles: body["token"]["roles"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect(),
        expires_at: DateTime::parse_from_rfc3339(body["token"]["expires_at"].as_str().unwrap())
            .unwrap()
            .with_timezone(&Utc),
        body,
    }
}

/// Revokes a token (its holder may).
async fn revoke(env: &Env, token: &str) {
    let resp = reqwest::Client::new()
        .delete(format!("{}/auth/tokens", env.url))
        .header("X-Auth-Token", token)
        .header("X-Subject-Token", token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
}

fn settings(env: &Env, revalidate_seconds: i64) -> KeystoneSettings {
    KeystoneSettings {
        auth_url: env.url.clone(),
        username: env.service_user.clone(),
        password: Secret::new(env.service_password.clone()),
        user_domain_name: "Default".into(),
        project_name: "service".into(),
        project_domain_name: "Default".into(),
        cache_size: 100,
        revalidate_after: Duration::seconds(revalidate_seconds),
        timeout: std::time::Duration::from_secs(10),
    }
}

/// A server validating tokens with this Keystone, on a clock the test moves.
async fn app(env: &Env, revalidate_seconds: i64, clock: Arc<ManualClock>) -> AuthApp {
    let keystone = Keystone::connect(settings(env, revalidate_seconds), clock)
        .await
        .expect("the service credentials work");
    AuthApp::spawn(move |_| Auth::keystone(keystone), Policy::defaults()).await
}

async fn actor(env: &Env, user: &str, project: &str) -> Actor {
    let issued = issue(env, user, Some(project)).await;
    Actor {
        name: user.into(),
        token: issued.token,
        user_id: issued.user_id,
        project_id: issued.project_id,
    }
}

#[tokio::test]
async fn keystone_tokens_pass_the_policy_matrix() {
    let Some(env) = env() else { return };
    let app = app(&env, 60, Arc::new(ManualClock::new(Utc::now()))).await;
    let cast = Cast {
        alpha_admin: actor(&env, "alpha-admin", "alpha").await,
        alpha_member: actor(&env, "alpha-member", "alpha").await,
        alpha_reader: actor(&env, "alpha-reader", "alpha").await,
        beta_admin: actor(&env, "beta-admin", "beta").await,
        beta_member: actor(&env, "beta-member", "beta").await,
        beta_reader: actor(&env, "beta-reader", "beta").await,
    };
    assert_ne!(cast.alpha_member.project_id, cast.beta_member.project_id);
    run_policy_matrix(&app, &cast).await;
}

#[tokio::test]
async fn a_revoked_token_stops_working_within_the_revalidation_interval() {
    let Some(env) = env() else { return };
    let now = Utc::now();
    let clock = Arc::new(ManualClock::new(now));
    let app = app(&env, 60, clock.clone()).await;
    let member = actor(&env, "alpha-member", "alpha").await;
    let get = || app.as_actor(&member, Method::GET, "/v1/leases", None);
    get().await.assert_status(StatusCode::OK);
    revoke(&env, &member.token).await;
    // Within the interval the cached validation still holds: that is the cache working...
    clock.set(now + Duration::seconds(59));
    get().await.assert_status(StatusCode::OK);
    // ...and once it has passed, Keystone is asked again and says the token is gone.
    clock.set(now + Duration::seconds(60));
    get().await.assert_unauthorized();
    get().await.assert_unauthorized();

    // With an interval of 0 every request asks Keystone: revocation is immediate.
    let strict = self::app(&env, 0, Arc::new(ManualClock::new(Utc::now()))).await;
    let member = actor(&env, "alpha-member", "alpha").await;
    strict
        .as_actor(&member, Method::GET, "/v1/leases", None)
        .await
        .assert_status(StatusCode::OK);
    revoke(&env, &member.token).await;
    strict
        .as_actor(&member, Method::GET, "/v1/leases", None)
        .await
        .assert_unauthorized();
}

#[tokio::test]
async fn an_expired_token_is_refused() {
    let Some(env) = env() else { return };
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = app(&env, 3600, clock.clone()).await;
    let issued = issue(&env, "beta-reader", Some("beta")).await;
    let member = Actor {
        name: "beta-reader".into(),
        token: issued.token.clone(),
        user_id: issued.user_id,
        project_id: issued.project_id,
    };
    app.as_actor(&member, Method::GET, "/v1/leases", None)
        .await
        .assert_status(StatusCode::OK);
    // From the cache: expiry is honoured even inside the revalidation interval.
    clock.set(issued.expires_at);
    app.as_actor(&member, Method::GET, "/v1/leases", None)
        .await
        .assert_unauthorized();
    // Not cached: Keystone's answer carries the expiry, and it has passed.
    let fresh = self::app(&env, 3600, Arc::new(ManualClock::new(issued.expires_at))).await;
    fresh
        .as_actor(&member, Method::GET, "/v1/leases", None)
        .await
        .assert_unauthorized();
}

#[tokio::test]
async fn a_token_not_scoped_to_a_project_is_refused() {
    let Some(env) = env() else { return };
    let app = app(&env, 60, Arc::new(ManualClock::new(Utc::now()))).await;
    let unscoped = issue(&env, "alpha-member", None).await;
    let r = app
        .call(Some(&unscoped.token), Method::GET, "/v1/leases", None, &[])
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert!(
        r.body["error_message"]
            .as_str()
            .unwrap()
            .contains("not scoped to a project")
    );
}

#[tokio::test]
async fn wrong_service_credentials_stop_the_start() {
    let Some(env) = env() else { return };
    let mut wrong = settings(&env, 60);
    wrong.password = Secret::new("not-the-password");
    let err = Keystone::connect(wrong, Arc::new(ManualClock::new(Utc::now())))
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("could not log in"), "{err}");
    assert!(!err.contains("not-the-password"), "{err}");
}

#[tokio::test]
async fn the_binary_validates_real_tokens_and_logs_no_secret() {
    let Some(env) = env() else { return };
    let db = TestDatabase::new().await;
    let port = free_port();
    let server = ServerProcess::start_with_env(
        &[
            "--auth",
            "keystone",
            "--keystone-url",
            &env.url,
            "--keystone-username",
            &env.service_user,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            &db.url,
            "--log",
            "trace",
        ],
        &[("BLAZAR_KEYSTONE_PASSWORD", &env.service_password)],
    )
    .await;
    let base = format!("http://127.0.0.1:{port}");
    let member = issue(&env, "alpha-member", Some("alpha")).await;
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{base}/v1/leases"))
        .header("X-Auth-Token", &member.token)
        .json(
            &json!({"name": "via-binary", "start_date": "2030-01-01 10:00",
                      "end_date": "2030-01-01 12:00", "reservations": []}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["lease"]["project_id"], member.project_id.as_str());
    assert_eq!(body["lease"]["user_id"], member.user_id.as_str());
    let resp = client
        .get(format!("{base}/v1/os-hosts"))
        .header("X-Auth-Token", &member.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = client
        .get(format!("{base}/v1/leases"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let logs = server.stop().await;
    assert!(
        logs.contains("Keystone accepted the service credentials"),
        "{logs}"
    );
    assert!(logs.contains("authenticated by Keystone"), "{logs}");
    assert!(
        !logs.contains(&member.token),
        "a user's token is in the logs"
    );
    assert!(
        !logs.contains(&env.service_password),
        "the service password is in the logs"
    );
}

#[tokio::test]
async fn the_calendar_sign_in_gets_the_users_own_token_from_keystone() {
    let Some(env) = env() else { return };
    let app = app(&env, 60, Arc::new(ManualClock::new(Utc::now()))).await;
    let r = app
        .call(
            None,
            Method::POST,
            "/calendar/api/sign-in",
            Some(
                json!({"username": "alpha-member", "password": env.user_password,
                        "project": "alpha", "domain": "Default"}),
            ),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let token = r.body["token"].as_str().unwrap().to_string();
    assert!(
        r.body["roles"]
            .as_array()
            .unwrap()
            .contains(&json!("member"))
    );
    // The token is the user's own: the API takes it as alpha's member.
    let leases = app
        .call(Some(&token), Method::GET, "/v1/leases", None, &[])
        .await;
    assert_eq!(leases.status, StatusCode::OK, "{}", leases.body);
    let r = app
        .call(
            None,
            Method::POST,
            "/calendar/api/sign-in",
            Some(
                json!({"username": "alpha-member", "password": "not-the-password",
                        "project": "alpha"}),
            ),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.body);
}

/// A server in auth mode keystone with its default of acting for users through trusts
/// (the standalone backend; the test runs the actions).
async fn trust_app(env: &Env) -> TestApp {
    let keystone = Keystone::connect(settings(env, 60), Arc::new(ManualClock::new(Utc::now())))
        .await
        .expect("the service credentials work");
    let (url, user, password) = (
        env.url.clone(),
        env.service_user.clone(),
        env.service_password.clone(),
    );
    let app = TestApp::builder()
        .auth_mode(blazar_server::config::AuthMode::Keystone)
        .auth_with(move |_| Auth::keystone(keystone))
        .policy(Policy::defaults())
        .auto_actions(false)
        .configure(move |cli| {
            cli.keystone_url = Some(url);
            cli.keystone_username = Some(user);
            cli.keystone_password = Some(Secret::new(password));
        })
        .spawn()
        .await;
    assert!(
        app.service.makes_trusts(),
        "trusts are the default with keystone"
    );
    app
}

/// `GET /v3/OS-TRUST/trusts/{id}` with `token`: the status and the trust.
async fn get_trust(env: &Env, token: &str, id: &str) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .get(format!("{}/OS-TRUST/trusts/{id}", env.url))
        .header("X-Auth-Token", token)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The ids of the trusts `trustor` made, asked with their own token.
async fn trusts_of(env: &Env, trustor: &Issued) -> Vec<String> {
    let resp = reqwest::Client::new()
        .get(format!(
            "{}/OS-TRUST/trusts?trustor_user_id={}",
            env.url, trustor.user_id
        ))
        .header("X-Auth-Token", &trustor.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    let mut ids: Vec<String> = body["trusts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// The service user acting through `trust`: a trust-scoped token.
async fn through_trust(env: &Env, trust: &str) -> Issued {
    let issued = login(
        env,
        &env.service_user,
        &env.service_password,
        Some(json!({"OS-TRUST:trust": {"id": trust}})),
    )
    .await;
    // What the tests below rely on: Keystone issued a token scoped to that very trust.
    assert_eq!(
        issued.body["token"]["OS-TRUST:trust"]["id"], trust,
        "a trust-scoped token: {}",
        issued.body
    );
    issued
}

fn lease_body(name: &str, reservations: Value) -> Value {
    json!({"name": name, "start_date": "2030-03-01 10:00", "end_date": "2030-03-01 12:00",
           "reservations": reservations, "events": []})
}

#[tokio::test]
async fn a_lease_acts_through_a_keystone_trust_that_is_deleted_with_it() {
    let Some(env) = env() else { return };
    let app = trust_app(&env).await;
    let member = issue(&env, "alpha-member", Some("alpha")).await;
    let admin = issue(&env, "alpha-admin", Some("alpha")).await;
    let service = login(
        &env,
        &env.service_user,
        &env.service_password,
        Some(json!({"project": {"name": "service", "domain": {"id": "default"}}})),
    )
    .await;

    let r = app
        .call(
            Some(&member.token),
            Method::POST,
            "/v1/leases",
            Some(lease_body("trusted", json!([]))),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let trust_id = r.body["lease"]["trust_id"].as_str().unwrap().to_string();

    // Keystone has it as Blazar makes it: from the member to the service user, in the
    // member's project, with the member's roles, impersonating.
    let (status, trust) = get_trust(&env, &admin.token, &trust_id).await;
    assert_eq!(status, StatusCode::OK, "{trust}");
    let trust = &trust["trust"];
    assert_eq!(trust["trustor_user_id"], member.user_id.as_str());
    assert_eq!(trust["trustee_user_id"], service.user_id.as_str());
    assert_eq!(trust["project_id"], member.project_id.as_str());
    assert_eq!(trust["impersonation"], true);
    assert!(trust["expires_at"].is_null(), "{trust}");
    let mut delegated: Vec<String> = trust["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    let mut held = member.roles.clone();
    delegated.sort();
    held.sort();
    assert_eq!(delegated, held);

    // The service user can act through it, as the member in the member's project: by hand,
    // and with the session the OpenStack backend uses.
    let scoped = through_trust(&env, &trust_id).await;
    assert_eq!(scoped.user_id, member.user_id);
    assert_eq!(scoped.project_id, member.project_id);
    assert_eq!(
        scoped.body["token"]["OS-TRUST:trust"]["id"],
        trust_id.as_str()
    );
    let backend_session = blazar_openstack::Session::new(blazar_openstack::SessionConfig {
        auth_url: env.url.clone(),
        credentials: blazar_openstack::Credentials::Password {
            username: env.service_user.clone(),
            password: env.service_password.clone(),
            user_domain: "Default".into(),
            project: "service".into(),
            project_domain: "Default".into(),
        },
        region: None,
        interface: "public".into(),
        endpoint_overrides: Default::default(),
        timeout: std::time::Duration::from_secs(10),
    })
    .unwrap();
    let through = backend_session.for_trust(&trust_id).unwrap();
    assert_eq!(through.user_id().await.unwrap(), member.user_id);

    // Deleting the lease deletes the trust, after commit, as an action.
    let r = app
        .call(
            Some(&member.token),
            Method::DELETE,
            &format!("/v1/leases/{lease_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert_eq!(
        get_trust(&env, &admin.token, &trust_id).await.0,
        StatusCode::OK
    );
    let report = app.run_actions().await;
    assert_eq!((report.done, report.failed), (1, 0), "{report:?}");
    let (status, gone) = get_trust(&env, &admin.token, &trust_id).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{gone}");
    // The service can no longer act through it.
    let resp = reqwest::Client::new()
        .post(format!("{}/auth/tokens?nocatalog", env.url))
        .json(&json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": env.service_user, "domain": {"id": "default"},
                "password": env.service_password}}},
            "scope": {"OS-TRUST:trust": {"id": trust_id}}}}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_client_error(), "{}", resp.status());
}

#[tokio::test]
async fn refused_and_dry_run_creates_leave_no_trust_behind() {
    let Some(env) = env() else { return };
    let app = trust_app(&env).await;
    // Only this test makes trusts as beta-member: its trust list is this test's to count.
    let member = issue(&env, "beta-member", Some("beta")).await;
    let reader = issue(&env, "beta-reader", Some("beta")).await;
    let before = trusts_of(&env, &member).await;

    // A dry run answers as a create would, and makes no trust.
    let r = app
        .call(
            Some(&member.token),
            Method::POST,
            "/v1/leases?dry_run=true",
            Some(lease_body("dry", json!([]))),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(trusts_of(&env, &member).await, before);

    // Refused before the trust is made (policy)...
    let r = app
        .call(
            Some(&reader.token),
            Method::POST,
            "/v1/leases",
            Some(lease_body("reader", json!([]))),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    // ...and after it (no host to allocate, decided in the write): it is deleted again.
    let r = app
        .call(
            Some(&member.token),
            Method::POST,
            "/v1/leases",
            Some(lease_body(
                "no-host",
                json!([{"resource_type": "physical:host", "min": 1, "max": 1,
                        "hypervisor_properties": "", "resource_properties": ""}]),
            )),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(trusts_of(&env, &member).await, before);

    // A token that may not delegate (a trust's own) is answered with Keystone's refusal,
    // in Blazar's error format, and nothing is written.
    let r = app
        .call(
            Some(&member.token),
            Method::POST,
            "/v1/leases",
            Some(lease_body("kept", json!([]))),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let kept_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let trust_id = r.body["lease"]["trust_id"].as_str().unwrap().to_string();
    let delegated = through_trust(&env, &trust_id).await;
    let r = app
        .call(
            Some(&delegated.token),
            Method::POST,
            "/v1/leases",
            Some(lease_body("redelegated", json!([]))),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["error_code"], 403, "{}", r.body);
    assert!(
        r.message().contains("Keystone refused the trust"),
        "{}",
        r.body
    );
    let leases = app
        .call(Some(&member.token), Method::GET, "/v1/leases", None, &[])
        .await;
    assert_eq!(
        leases.body["leases"].as_array().unwrap().len(),
        1,
        "{}",
        leases.body
    );

    // The lease that was made goes with its trust.
    let r = app
        .call(
            Some(&member.token),
            Method::DELETE,
            &format!("/v1/leases/{kept_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    app.run_actions().await;
    assert_eq!(trusts_of(&env, &member).await, before);
}
