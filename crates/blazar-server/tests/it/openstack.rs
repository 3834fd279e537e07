//! The OpenStack backend against a real cloud: Keystone, Placement, Glance, Nova with
//! blazar-nova's BlazarFilter and fake-driver computes, Neutron, brought up by
//! `scripts/openstack/test.sh`, which sets BLAZAR_TEST_OPENSTACK_STATE. Without it these
//! tests say so and pass: `cargo test` alone needs no cloud.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use blazar_openstack::session::{Call, SessionConfig};
use blazar_openstack::{Cloud, Credentials, OpenStackBackend, OpenStackSettings};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, t};

struct Env(HashMap<String, String>);

impl Env {
    fn get(&self, key: &str) -> String {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("{key} missing from the cloud's env files"))
    }

    fn session(&self, username: &str, password: &str, project: &str) -> SessionConfig {
        SessionConfig {
            auth_url: self.get("OS_AUTH_URL"),
            credentials: Credentials::Password {
                username: username.into(),
                password: password.into(),
                user_domain: "Default".into(),
                project: project.into(),
                project_domain: "Default".into(),
            },
            region: Some("RegionOne".into()),
            interface: "public".into(),
            endpoint_overrides: HashMap::new(),
            timeout: Duration::from_secs(60),
        }
    }

    fn admin(&self) -> Cloud {
        Cloud::new(self.session(
            &self.get("OS_USERNAME"),
            &self.get("OS_PASSWORD"),
            &self.get("OS_PROJECT_NAME"),
        ))
        .unwrap()
    }

    fn service(&self) -> Cloud {
        Cloud::new(self.session(
            &self.get("OS_SERVICE_USERNAME"),
            &self.get("OS_SERVICE_PASSWORD"),
            &self.get("OS_SERVICE_PROJECT_NAME"),
        ))
        .unwrap()
    }

    fn member(&self, project: &str) -> Cloud {
        Cloud::new(self.session(
            &format!("{project}-member"),
            &self.get("OS_USER_PASSWORD"),
            project,
        ))
        .unwrap()
    }
}

fn env() -> Option<Env> {
    let Some(state) = std::env::var("BLAZAR_TEST_OPENSTACK_STATE")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        eprintln!(
            "skipping: BLAZAR_TEST_OPENSTACK_STATE is not set (scripts/openstack/test.sh runs \
             these tests against a real cloud)"
        );
        return None;
    };
    let mut vars = HashMap::new();
    for file in ["openrc", "env"] {
        let text = std::fs::read_to_string(format!("{state}/{file}")).unwrap();
        for line in text.lines() {
            if let Some((k, v)) = line.trim_start_matches("export ").split_once('=') {
                vars.insert(k.trim().to_string(), v.trim().to_string());
            }
        }
    }
    Some(Env(vars))
}

async fn compute(cloud: &Cloud, method: Method, path: &str, body: Option<Value>) -> Value {
    cloud
        .session
        .call(
            "compute",
            method,
            path,
            Call {
                body,
                headers: vec![("openstack-api-version", "compute 2.61".into())],
                request_id: None,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .body
}

/// Boots a server as `cloud`'s user, with the `reservation` hint if given, and waits until
/// it is ACTIVE or ERROR. Returns its id and status.
async fn boot(cloud: &Cloud, name: &str, reservation: Option<&str>) -> (String, String) {
    let flavors = compute(cloud, Method::GET, "/flavors", None).await;
    let flavor = flavors["flavors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "m1.tiny")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let images = cloud
        .session
        .call(
            "image",
            Method::GET,
            "/v2/images?name=cirros-fake",
            Call::default(),
        )
        .await
        .unwrap()
        .body;
    let image = images["images"][0]["id"].as_str().unwrap().to_string();
    let mut body = json!({"server": {"name": name, "imageRef": image, "flavorRef": flavor,
        "networks": "none"}});
    if let Some(r) = reservation {
        body["os:scheduler_hints"] = json!({ "reservation": r });
    }
    let made = compute(cloud, Method::POST, "/servers", Some(body)).await;
    let id = made["server"]["id"].as_str().unwrap().to_string();
    for _ in 0..240 {
        let s = compute(cloud, Method::GET, &format!("/servers/{id}"), None).await;
        let status = s["server"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if status == "ACTIVE" || status == "ERROR" {
            return (id, status);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("server {name} neither ACTIVE nor ERROR after 60 s");
}

async fn server_host(admin: &Cloud, id: &str) -> String {
    let s = compute(admin, Method::GET, &format!("/servers/{id}"), None).await;
    s["server"]["OS-EXT-SRV-ATTR:host"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn host_reservations_move_hosts_between_the_freepool_and_their_aggregate() {
    let Some(env) = env() else { return };
    let admin = env.admin();
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(
        env.service(),
        OpenStackSettings {
            server_delete_timeout: Duration::from_secs(60),
            ..OpenStackSettings::default()
        },
    );
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let placement = admin.placement(None);

    // Enrolment reads Nova: an unknown hypervisor is Blazar's 404.
    let r = app.post("/v1/os-hosts", json!({"name": "compute-9"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    assert_eq!(r.message(), "Host 'compute-9' not found!");
    // Two of the three computes are Blazar's; the third stays in Nova's general pool.
    let mut host_ids = Vec::new();
    for name in ["compute-1", "compute-2"] {
        let r = app
            .post(
                "/v1/os-hosts",
                json!({"name": name, "vcpus": 999, "gpu": "false"}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        let host = &r.body["host"];
        // Facts come from Nova (the request's are dropped, as Blazar does).
        assert_eq!(host["hypervisor_type"], "fake");
        assert_eq!(host["service_name"], name);
        assert_ne!(host["vcpus"], 999);
        assert_eq!(host["availability_zone"], "nova");
        assert_eq!(host["gpu"], "false");
        host_ids.push(host["id"].as_str().unwrap().to_string());
        // Its provider for instance reservations hangs under the compute node's.
        let node = placement.provider_by_name(name).await.unwrap().unwrap();
        let nested = placement
            .provider_by_name(&format!("blazar_{name}"))
            .await
            .unwrap()
            .expect("blazar_ provider");
        assert_eq!(nested.parent.as_deref(), Some(node.uuid.as_str()));
    }
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    let pooled: BTreeSet<String> = freepool.hosts.iter().cloned().collect();
    assert_eq!(
        pooled,
        BTreeSet::from(["compute-1".to_string(), "compute-2".to_string()])
    );
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .host_lease("alpha", "2030-01-01 10:00", "2030-01-01 12:00", 2, 2, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let rid = r.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.act_as_admin();

    // Start: both hosts leave the freepool for the reservation's aggregate.
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    let actions = app
        .get(&format!("/v1/leases/{lease_id}/actions"))
        .await
        .body;
    assert_eq!(lease["lease"]["status"], "ACTIVE", "{actions}");
    let aggregate = nova.find_aggregate(&rid).await.unwrap().expect("aggregate");
    assert_eq!(
        aggregate.availability_zone.as_deref(),
        Some(format!("blazar_{rid}").as_str())
    );
    assert_eq!(aggregate.metadata["blazar:owner"], json!(alpha));
    let held: BTreeSet<String> = aggregate.hosts.iter().cloned().collect();
    assert_eq!(
        held,
        BTreeSet::from(["compute-1".to_string(), "compute-2".to_string()])
    );
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert!(freepool.hosts.is_empty(), "{:?}", freepool.hosts);

    // BlazarFilter: alpha with the hint lands on a reserved host; beta without a hint
    // lands outside them; beta with alpha's hint finds no host.
    let alpha_cloud = env.member("alpha");
    let beta_cloud = env.member("beta");
    let (mine, status) = boot(&alpha_cloud, "in-reservation", Some(&rid)).await;
    assert_eq!(status, "ACTIVE");
    assert!(held.contains(&server_host(&admin, &mine).await));
    let (other, status) = boot(&beta_cloud, "general-pool", None).await;
    assert_eq!(status, "ACTIVE");
    assert_eq!(server_host(&admin, &other).await, "compute-3");
    // A hypervisor with servers on it cannot be enrolled (Blazar's HostHavingServers).
    let r = app.post("/v1/os-hosts", json!({"name": "compute-3"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.message()
            .starts_with(&format!("Servers [{other}] found for host compute-3")),
        "{}",
        r.message()
    );
    let (intruder, status) = boot(&beta_cloud, "intruder", Some(&rid)).await;
    assert_eq!(status, "ERROR", "BlazarFilter let another project in");

    // End: alpha's server is deleted, the hosts go back to the freepool, the aggregate goes.
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    let actions = app
        .get(&format!("/v1/leases/{lease_id}/actions"))
        .await
        .body;
    assert_eq!(lease["lease"]["status"], "TERMINATED", "{actions}");
    assert!(nova.find_aggregate(&rid).await.unwrap().is_none());
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    let back: BTreeSet<String> = freepool.hosts.iter().cloned().collect();
    assert_eq!(back, held);
    assert!(
        nova.servers_on_host("compute-1")
            .await
            .unwrap()
            .into_iter()
            .chain(nova.servers_on_host("compute-2").await.unwrap())
            .all(|(id, _)| id != mine),
        "alpha's server outlived the lease"
    );

    // Removing the hosts takes them out of the freepool and drops their providers.
    for id in [other, intruder] {
        nova.delete_server(&id).await.unwrap();
    }
    for id in &host_ids {
        let r = app.delete(&format!("/v1/os-hosts/{id}")).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    }
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert!(freepool.hosts.is_empty(), "{:?}", freepool.hosts);
    assert!(
        placement
            .provider_by_name("blazar_compute-1")
            .await
            .unwrap()
            .is_none()
    );
    nova.delete_aggregate(&freepool).await.unwrap();
}
