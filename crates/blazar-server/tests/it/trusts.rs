//! Acting for users through trusts, with a Keystone that records what it is asked (the real
//! one is in `keystone.rs`): when a trust is made, that actions carry it, and when it is
//! deleted.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use blazar_service::{
    Action, ActionError, ActionOutput, Backend, Identity, StandaloneBackend, TrustError, Trusts,
    UserToken,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Response, TestApp, t};

/// What happened, in order: `create <id> <user> <project> <roles>`, `forget <id>`,
/// `delete <id>` from Keystone, `<kind> <trust>` from the backend.
type Log = Arc<Mutex<Vec<String>>>;

struct FakeKeystone {
    log: Log,
}

#[async_trait]
impl Trusts for FakeKeystone {
    async fn create(&self, identity: &Identity, token: &UserToken) -> Result<String, TrustError> {
        // A token of user `delegated` may not make trusts (as a trust's own token).
        if token.expose().contains(":delegated:") {
            return Err(TrustError::Refused(
                "creating the trust: 403 Forbidden Delegated tokens cannot manage trusts.".into(),
            ));
        }
        let mut log = self.log.lock().unwrap();
        let id = format!(
            "trust-{}",
            log.iter().filter(|l| l.starts_with("create")).count() + 1
        );
        log.push(format!(
            "create {id} {} {} {}",
            identity.user_id,
            identity.project_id,
            identity.roles.join(",")
        ));
        Ok(id)
    }

    async fn delete_as_trustor(&self, trust_id: &str, token: &UserToken) -> Result<(), TrustError> {
        assert!(
            token.expose().starts_with("noauth:"),
            "the caller's own token"
        );
        self.log.lock().unwrap().push(format!("forget {trust_id}"));
        Ok(())
    }

    async fn delete(&self, trust_id: &str) -> Result<(), TrustError> {
        self.log.lock().unwrap().push(format!("delete {trust_id}"));
        Ok(())
    }
}

/// The standalone backend, logging each action with the trust it carries.
struct Recorder {
    log: Log,
}

#[async_trait]
impl Backend for Recorder {
    async fn apply(
        &self,
        store: &blazar_db::Store,
        action: &Action,
    ) -> Result<ActionOutput, ActionError> {
        self.log.lock().unwrap().push(format!(
            "{} {}",
            action.kind,
            action.trust_id.as_deref().unwrap_or("-")
        ));
        StandaloneBackend.apply(store, action).await
    }
}

async fn app(make: bool) -> (TestApp, Log) {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let app = TestApp::builder()
        .backend(Arc::new(Recorder { log: log.clone() }))
        .trusts(Arc::new(FakeKeystone { log: log.clone() }), make)
        .auto_actions(false)
        .spawn()
        .await;
    let r = app
        .call(
            Some(OPERATOR),
            Method::POST,
            "/v1/os-hosts",
            Some(json!({"name": "h1"})),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    (app, log)
}

const OPERATOR: &str = "noauth:operator:ops:admin";
const ALICE: &str = "noauth:alice:alpha:member,reader";

fn host_lease(name: &str, hosts: u32) -> Value {
    json!({"name": name, "start_date": "2030-01-02 10:00", "end_date": "2030-01-02 12:00",
           "reservations": [{"resource_type": "physical:host", "min": hosts, "max": hosts,
               "hypervisor_properties": "", "resource_properties": ""}],
           "events": []})
}

/// A request of Alice's (member of project alpha).
async fn as_alice(app: &TestApp, method: Method, path: &str, body: Option<Value>) -> Response {
    app.call(Some(ALICE), method, path, body, &[]).await
}

/// Alice deletes her lease, which the server accepts.
async fn delete_as_alice(app: &TestApp, lease_id: &str) {
    let r = as_alice(app, Method::DELETE, &format!("/v1/leases/{lease_id}"), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
}

/// The clock at the leases' start, their events run and their actions carried out.
async fn start_leases(app: &TestApp) {
    app.set_time(t(2030, 1, 2, 10, 0));
    app.service.tick(t(2030, 1, 2, 10, 0)).await.unwrap();
    app.run_actions().await;
}

fn taken(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[tokio::test]
async fn a_lease_acts_through_its_trust_until_it_is_deleted_last() {
    let (app, log) = app(true).await;
    let r = as_alice(&app, Method::POST, "/v1/leases", Some(host_lease("l", 1))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    assert_eq!(r.body["lease"]["trust_id"], "trust-1");
    let alice = r.body["lease"]["user_id"].as_str().unwrap().to_string();
    let alpha = r.body["lease"]["project_id"].as_str().unwrap().to_string();
    assert_eq!(
        taken(&log),
        [format!("create trust-1 {alice} {alpha} member,reader")]
    );
    // Shown as stored.
    let r = as_alice(&app, Method::GET, &format!("/v1/leases/{lease_id}"), None).await;
    assert_eq!(r.body["lease"]["trust_id"], "trust-1");

    // The start hands over through the trust; the delete takes back, then deletes the trust.
    start_leases(&app).await;
    assert_eq!(taken(&log), ["start trust-1"]);
    delete_as_alice(&app, &lease_id).await;
    let report = app.run_actions().await;
    assert_eq!((report.done, report.failed), (2, 0), "{report:?}");
    assert_eq!(taken(&log), ["stop trust-1", "delete trust-1"]);
}

#[tokio::test]
async fn only_a_create_that_is_written_keeps_its_trust() {
    let (app, log) = app(true).await;
    // A dry run makes none.
    let r = as_alice(
        &app,
        Method::POST,
        "/v1/leases?dry_run=true",
        Some(host_lease("dry", 1)),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert!(taken(&log).is_empty());
    // Refused before the trust (a bad date): none made.
    let mut bad = host_lease("bad", 1);
    bad["end_date"] = json!("2030-01-01 00:00");
    let r = as_alice(&app, Method::POST, "/v1/leases", Some(bad)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(taken(&log).is_empty());
    // Refused by the write (two hosts asked, one exists): the trust made goes again.
    let r = as_alice(&app, Method::POST, "/v1/leases", Some(host_lease("big", 2))).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let happened = taken(&log);
    assert_eq!(happened.len(), 2, "{happened:?}");
    assert!(happened[0].starts_with("create trust-1 "), "{happened:?}");
    assert_eq!(happened[1], "forget trust-1");
    // Keystone's refusal is the answer, in Blazar's format, and nothing is written.
    let r = app
        .call(
            Some("noauth:delegated:alpha:member"),
            Method::POST,
            "/v1/leases",
            Some(host_lease("no", 1)),
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["error_code"], 403);
    assert!(
        r.message()
            .contains("Keystone refused the trust that lets Blazar act for you"),
        "{}",
        r.body
    );
    let r = app
        .call(Some(OPERATOR), Method::GET, "/v1/leases", None, &[])
        .await;
    assert_eq!(r.body["leases"], json!([]), "{}", r.body);
}

#[tokio::test]
async fn leases_made_without_trusts_keep_acting_in_the_project() {
    let (app, log) = app(false).await;
    let r = as_alice(&app, Method::POST, "/v1/leases", Some(host_lease("l", 1))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    // Blazar's shape of id, naming no trust.
    let trust_id = r.body["lease"]["trust_id"].as_str().unwrap();
    assert_eq!(trust_id.len(), 32);
    assert!(trust_id.chars().all(|c| c.is_ascii_hexdigit()));
    start_leases(&app).await;
    delete_as_alice(&app, &lease_id).await;
    app.run_actions().await;
    assert_eq!(taken(&log), ["start -", "stop -"]);
}
