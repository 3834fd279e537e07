//! Connection settings: noauth, admin tokens, Keystone password authentication with the
//! catalog, clouds.yaml, and what is said when something is missing. A fake Keystone (and a
//! fake Blazar that records the token it is given) stands in for OpenStack.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::harness::{Run, run_blazar};

#[derive(Clone)]
struct Fake {
    base: String,
    tokens_seen: Arc<Mutex<Vec<String>>>,
}

async fn issue_token(State(fake): State<Fake>, Json(body): Json<Value>) -> Response {
    let user = &body["auth"]["identity"]["password"]["user"];
    let scope = &body["auth"]["scope"]["project"];
    if user["name"] != "alice" || user["password"] != "s3cret" || scope["name"] != "demo" {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"code": 401, "title": "Unauthorized",
                "message": "The request you have made requires authentication."}})),
        )
            .into_response();
    }
    let catalog = json!({"token": {"catalog": [
        {"type": "identity", "endpoints": [{"interface": "public", "url": format!("{}/v3", fake.base)}]},
        {"type": "reservation", "name": "blazar", "endpoints": [
            {"interface": "public", "region": "RegionOne", "url": format!("{}/v1", fake.base)},
            {"interface": "internal", "region": "RegionOne", "url": "http://127.0.0.1:9/v1"}
        ]}
    ]}});
    (
        StatusCode::CREATED,
        [("X-Subject-Token", "tok-alice")],
        Json(catalog),
    )
        .into_response()
}

async fn list_leases(State(fake): State<Fake>, headers: HeaderMap) -> Json<Value> {
    let token = headers
        .get("x-auth-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<none>")
        .to_string();
    fake.tokens_seen.lock().unwrap().push(token);
    Json(json!({"leases": []}))
}

struct FakeCloud {
    fake: Fake,
    home: tempfile::TempDir,
}

impl FakeCloud {
    async fn start() -> FakeCloud {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Fake {
            base: format!("http://{}", listener.local_addr().unwrap()),
            tokens_seen: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/v3/auth/tokens", post(issue_token))
            .route("/v1/leases", get(list_leases))
            .with_state(fake.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeCloud {
            fake,
            home: tempfile::tempdir().unwrap(),
        }
    }

    async fn blazar(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        run_blazar(args, env, self.home.path()).await
    }

    fn tokens(&self) -> Vec<String> {
        std::mem::take(&mut *self.fake.tokens_seen.lock().unwrap())
    }

    fn password_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OS_AUTH_URL", format!("{}/v3", self.fake.base)),
            ("OS_USERNAME", "alice".into()),
            ("OS_PASSWORD", "s3cret".into()),
            ("OS_PROJECT_NAME", "demo".into()),
            ("OS_USER_DOMAIN_NAME", "Default".into()),
            ("OS_PROJECT_DOMAIN_NAME", "Default".into()),
        ]
    }
}

fn env_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noauth_and_admin_token() {
    let cloud = FakeCloud::start().await;
    let endpoint = format!("{}/v1", cloud.fake.base);
    let run = cloud
        .blazar(
            &[
                "--os-auth-type",
                "none",
                "--os-endpoint",
                &endpoint,
                "lease-list",
            ],
            &[],
        )
        .await;
    assert_eq!(run.ok(), "\n");
    assert_eq!(cloud.tokens(), ["notused"]);

    // BLAZAR_URL may be the bare server address; /v1 is added.
    let run = cloud
        .blazar(
            &["lease-list"],
            &[("BLAZAR_URL", &cloud.fake.base), ("OS_TOKEN", "abc")],
        )
        .await;
    assert_eq!(run.ok(), "\n");
    assert_eq!(cloud.tokens(), ["abc"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keystone_password_and_catalog() {
    let cloud = FakeCloud::start().await;
    let env = cloud.password_env();
    let run = cloud
        .blazar(&["lease-list", "-f", "json"], &env_refs(&env))
        .await;
    assert_eq!(run.ok(), "[]\n");
    assert_eq!(cloud.tokens(), ["tok-alice"]);

    // The same from flags, with the region named.
    let auth_url = format!("{}/v3", cloud.fake.base);
    let run = cloud
        .blazar(
            &[
                "--os-auth-url",
                &auth_url,
                "--os-username",
                "alice",
                "--os-password",
                "s3cret",
                "--os-project-name",
                "demo",
                "--os-region-name",
                "RegionOne",
                "lease-list",
            ],
            &[],
        )
        .await;
    assert_eq!(run.ok(), "\n");
    assert_eq!(cloud.tokens(), ["tok-alice"]);

    let mut wrong = env.clone();
    wrong[2].1 = "wrong".into();
    let run = cloud.blazar(&["lease-list"], &env_refs(&wrong)).await;
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "ERROR: Keystone at {}/v3/auth/tokens refused to issue a token (401 Unauthorized): \
             The request you have made requires authentication.; check the user name, password \
             (or token, application credential), project and domains\n",
            cloud.fake.base
        )
    );

    let mut elsewhere = env.clone();
    elsewhere.push(("OS_REGION_NAME", "Mars".into()));
    let run = cloud.blazar(&["lease-list"], &env_refs(&elsewhere)).await;
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "ERROR: the \"reservation\" service has no public endpoint in region Mars; it has: \
         public in RegionOne, internal in RegionOne. Set OS_INTERFACE or OS_REGION_NAME accordingly\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clouds_yaml() {
    let cloud = FakeCloud::start().await;
    let dir = cloud.home.path().join(".config/openstack");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("clouds.yaml"),
        format!(
            "clouds:\n  fake:\n    auth:\n      auth_url: {}/v3\n      username: alice\n      \
             project_name: demo\n      user_domain_name: Default\n      project_domain_name: Default\n    \
             region_name: RegionOne\n  other:\n    auth:\n      auth_url: http://127.0.0.1:9\n",
            cloud.fake.base
        ),
    )
    .unwrap();
    // The password comes from the environment, as people keep it out of the file.
    let run = cloud
        .blazar(
            &["lease-list"],
            &[("OS_CLOUD", "fake"), ("OS_PASSWORD", "s3cret")],
        )
        .await;
    assert_eq!(run.ok(), "\n");
    assert_eq!(cloud.tokens(), ["tok-alice"]);

    let run = cloud
        .blazar(&["--os-cloud", "missing", "lease-list"], &[])
        .await;
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .starts_with("ERROR: cloud \"missing\" is not in ")
            && run
                .stderr
                .ends_with("clouds.yaml; it defines: fake, other\n"),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_said_when_nothing_works() {
    let home = tempfile::tempdir().unwrap();
    let run = run_blazar(&["lease-list"], &[], home.path()).await;
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .starts_with("ERROR: no Blazar to talk to: give its URL with --os-endpoint"),
        "{}",
        run.stderr
    );

    // Port 9 (discard) on loopback: nothing listens there.
    let run = run_blazar(
        &["lease-list"],
        &[("BLAZAR_URL", "http://127.0.0.1:9")],
        home.path(),
    )
    .await;
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .starts_with("ERROR: cannot reach http://127.0.0.1:9/v1/leases: ")
            && run.stderr.contains("Is the server running"),
        "{}",
        run.stderr
    );

    let run = run_blazar(
        &["lease-list"],
        &[("BLAZAR_URL", "127.0.0.1:1234")],
        home.path(),
    )
    .await;
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("give a URL such as http://127.0.0.1:1234/v1"),
        "{}",
        run.stderr
    );

    let run = run_blazar(
        &["lease-list"],
        &[
            ("OS_AUTH_URL", "http://127.0.0.1:9/v3"),
            ("OS_USERNAME", "alice"),
        ],
        home.path(),
    )
    .await;
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "ERROR: password authentication needs a password: set OS_PASSWORD (or --os-password)\n"
    );
}
