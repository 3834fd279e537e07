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

/// The tests share one cloud: one at a time.
static CLOUD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A TCP relay to `target` that can be cut (new connections are dropped at once) and
/// restored: a service that becomes unreachable for a while.
struct Relay {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    async fn to(target: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if *watch.borrow() {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let mut watch = watch.clone();
                // A cut also drops the connections already open (kept alive by clients).
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = watch.wait_for(|c| *c) => {}
                        }
                    }
                });
            }
        });
        Relay { port, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Puts the cloud back as `up.sh` left it, whatever an earlier failed test left behind: no
/// servers, no aggregates, every compute service enabled.
async fn reset_cloud(admin: &Cloud) {
    let nova = admin.nova(None);
    let servers = compute(admin, Method::GET, "/servers?all_tenants=1", None).await;
    for s in servers["servers"].as_array().unwrap() {
        nova.delete_server(s["id"].as_str().unwrap()).await.unwrap();
    }
    for _ in 0..120 {
        let left = compute(admin, Method::GET, "/servers?all_tenants=1", None).await;
        if left["servers"].as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for aggregate in nova.aggregates().await.unwrap() {
        for host in &aggregate.hosts {
            nova.remove_host(&aggregate, host).await.unwrap();
        }
        nova.delete_aggregate(&aggregate).await.unwrap();
    }
    for host in ["compute-1", "compute-2", "compute-3"] {
        set_compute_enabled(admin, host, true).await;
    }
}

/// Disables or enables the compute service of `host` in Nova, as an operator would.
async fn set_compute_enabled(admin: &Cloud, host: &str, enabled: bool) {
    let services = compute(
        admin,
        Method::GET,
        &format!("/os-services?binary=nova-compute&host={host}"),
        None,
    )
    .await;
    let id = services["services"][0]["id"].as_str().unwrap().to_string();
    let body = if enabled {
        json!({"status": "enabled"})
    } else {
        json!({"status": "disabled", "disabled_reason": "blazar-rs test"})
    };
    compute(
        admin,
        Method::PUT,
        &format!("/os-services/{id}"),
        Some(body),
    )
    .await;
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
                vars.insert(k.trim().to_string(), v.trim().trim_matches('"').to_string());
            }
        }
    }
    Some(Env(vars))
}

async fn compute(cloud: &Cloud, method: Method, path: &str, body: Option<Value>) -> Value {
    // A loaded two-core machine sometimes drops a connection: try again, as a client would.
    let mut tries = 0;
    loop {
        tries += 1;
        let answer = cloud
            .session
            .call(
                "compute",
                method.clone(),
                path,
                Call {
                    body: body.clone(),
                    headers: vec![("openstack-api-version", "compute 2.61".into())],
                    request_id: None,
                },
            )
            .await;
        match answer {
            Ok(a) => return a.body,
            Err(blazar_openstack::Error::Unreachable(e)) if tries < 3 => {
                eprintln!("{path}: {e}; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("{path}: {e}"),
        }
    }
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
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
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
        // Allocation ratios come from the compute node's Placement inventory.
        for key in [
            "cpu_allocation_ratio",
            "ram_allocation_ratio",
            "disk_allocation_ratio",
        ] {
            let ratio: f64 = host[key]
                .as_str()
                .unwrap_or_default()
                .parse()
                .unwrap_or(0.0);
            assert!(ratio > 0.0, "{key}: {host}");
        }
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
        .post(
            "/v1/leases",
            json!({"name": "alpha", "start_date": "2030-01-01 10:00",
                "end_date": "2030-01-01 12:00", "before_end_date": "2030-01-01 11:00",
                "reservations": [{"resource_type": "physical:host", "min": 2, "max": 2,
                    "hypervisor_properties": "", "resource_properties": "",
                    "before_end": "snapshot"}], "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let (lease_id, rid) = lease_ids(&r);
    app.act_as_admin();
    // At reservation, its aggregate exists, empty, in its own zone, owned by the project.
    let prepared = nova
        .find_aggregate(&rid)
        .await
        .unwrap()
        .expect("aggregate at reservation");
    assert!(prepared.hosts.is_empty());
    assert_eq!(prepared.metadata["blazar:owner"], json!(alpha));
    // A reservation deleted before it starts takes its aggregate with it.
    let r = app
        .host_lease("gone", "2030-06-01 10:00", "2030-06-01 12:00", 1, 1, "")
        .await;
    let gone_rid = r.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(nova.find_aggregate(&gone_rid).await.unwrap().is_some());
    let gone_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        app.delete(&format!("/v1/leases/{gone_id}")).await.status,
        StatusCode::NO_CONTENT
    );
    assert!(nova.find_aggregate(&gone_rid).await.unwrap().is_none());

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

    // Before the end, `before_end: snapshot` makes an image of alpha's server.
    app.tick_at(t(2030, 1, 1, 11, 0)).await;
    assert!(
        admin
            .image_of_server_exists("reserved_in-reservation", &mine)
            .await
            .unwrap(),
        "no snapshot of the server before the lease ended"
    );

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

/// A host the cloud shows in another reservation's aggregate: a take-back leaves it to that
/// one (a late take-back must not undo the next lease's hand-over), and a hand-over takes it
/// from there (a take-back that failed for good must not keep the next lease from it).
#[tokio::test]
async fn a_host_in_another_reservations_aggregate_goes_to_whom_the_database_grants_it() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1"]).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    app.act_as(&alpha, "alpha-user", "member");
    let a = app
        .host_lease("a", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1, "")
        .await;
    let b = app
        .host_lease("b", "2030-01-01 13:00", "2030-01-01 14:00", 1, 1, "")
        .await;
    app.act_as_admin();
    let field =
        |body: &Value, pointer: &str| body.pointer(pointer).unwrap().as_str().unwrap().to_string();
    let (a_id, b_id) = (field(&a.body, "/lease/id"), field(&b.body, "/lease/id"));
    let rid = "/lease/reservations/0/id";
    let (a_rid, b_rid) = (field(&a.body, rid), field(&b.body, rid));
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let held = nova.find_aggregate(&a_rid).await.unwrap().unwrap();
    assert_eq!(held.hosts, ["compute-1"]);
    // Meanwhile the cloud shows the host in another reservation's aggregate.
    nova.remove_host(&held, "compute-1").await.unwrap();
    let other = nova
        .ensure_aggregate("another-reservation", Some("blazar_another-reservation"))
        .await
        .unwrap();
    nova.add_host(&other, "compute-1").await.unwrap();

    // A's end leaves it there: not put in the freepool, its aggregate not emptied.
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    let a_lease = app.get(&format!("/v1/leases/{a_id}")).await.body;
    assert_eq!(a_lease["lease"]["status"], "TERMINATED", "{a_lease}");
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert!(freepool.hosts.is_empty(), "{:?}", freepool.hosts);
    let other = nova
        .find_aggregate("another-reservation")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(other.hosts, ["compute-1"]);

    // B's start: the database grants B the host, so B gets it from there.
    app.tick_at(t(2030, 1, 1, 13, 0)).await;
    let b_lease = app.get(&format!("/v1/leases/{b_id}")).await.body;
    let actions = app.get(&format!("/v1/leases/{b_id}/actions")).await.body;
    assert_eq!(b_lease["lease"]["status"], "ACTIVE", "{actions}");
    let granted = nova.find_aggregate(&b_rid).await.unwrap().unwrap();
    assert_eq!(granted.hosts, ["compute-1"]);
    let other = nova
        .find_aggregate("another-reservation")
        .await
        .unwrap()
        .unwrap();
    assert!(other.hosts.is_empty(), "{:?}", other.hosts);

    app.tick_at(t(2030, 1, 1, 14, 0)).await;
    nova.delete_aggregate(&other).await.unwrap();
    withdraw(&app, &admin, &ids).await;
}

/// A start that fails for good after taking its host out of the freepool leaves the host in
/// no pool, where BlazarFilter admits anyone's servers: the reconciler puts it into the
/// owner's aggregate once Nova lets it.
#[tokio::test]
async fn a_failed_start_leaves_the_host_in_the_freepool_and_one_in_no_pool_goes_to_its_owner() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    // One attempt: the start's failure is for good at once.
    let app = TestApp::builder()
        .settings(blazar_service::Settings {
            action_max_attempts: Some(1),
            ..blazar_service::Settings::default()
        })
        .backend(Arc::new(backend))
        .spawn()
        .await;
    let ids = enrol(&app, &["compute-1"]).await;
    // With a host whose compute service Nova deleted since it was enrolled: stranded with
    // the lease, it is listed as left once, not also as missing from the freepool.
    enrol_gone_host(&app).await;
    let r = app
        .host_lease("l", "2030-01-01 10:00", "2030-01-01 12:00", 2, 2, "")
        .await;
    let (lease_id, rid) = lease_ids(&r);
    // Another availability zone holds the host: Nova refuses it the reservation's.
    let elsewhere = nova
        .ensure_aggregate("elsewhere", Some("elsewhere-zone"))
        .await
        .unwrap();
    nova.add_host(&elsewhere, "compute-1").await.unwrap();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ERROR", "{actions}");
    // The hand-over failed before taking the host out of the freepool, where no project's
    // servers land: never in no pool, open to all.
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts, ["compute-1"]);
    let report = reconcile_report(&app, false).await;
    assert!(
        !report["repairs"].to_string().contains("compute-1"),
        "{report}"
    );
    let gone = report_lines(&report, "repairs")
        .into_iter()
        .filter(|l| l.contains("compute-gone"))
        .count();
    assert_eq!(gone, 1, "{report}");
    assert_eq!(report["failed"], json!([]), "{report}");

    // The operator takes the host out of the other zone, and out of the freepool by
    // mistake: in no pool, the reconciler hands it to the lease the database still grants
    // it to.
    let elsewhere = nova.find_aggregate("elsewhere").await.unwrap().unwrap();
    nova.remove_host(&elsewhere, "compute-1").await.unwrap();
    nova.remove_host(&freepool, "compute-1").await.unwrap();
    let report = reconcile_report(&app, false).await;
    assert!(
        report["repairs"].to_string().contains("in no pool"),
        "{report}"
    );
    let held = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert_eq!(held.hosts, ["compute-1"]);

    // Its end takes it back to the freepool.
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts, ["compute-1"]);
    nova.delete_aggregate(&elsewhere).await.unwrap();
    withdraw(&app, &admin, &ids).await;
}

async fn enrol(app: &TestApp, names: &[&str]) -> Vec<String> {
    let mut ids = Vec::new();
    for name in names {
        let r = app.post("/v1/os-hosts", json!({ "name": name })).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        ids.push(r.body["host"]["id"].as_str().unwrap().to_string());
    }
    ids
}

async fn withdraw(app: &TestApp, admin: &Cloud, ids: &[String]) {
    for id in ids {
        let r = app.delete(&format!("/v1/os-hosts/{id}")).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    }
    let nova = admin.nova(None);
    if let Some(freepool) = nova.find_aggregate("freepool").await.unwrap() {
        nova.delete_aggregate(&freepool).await.unwrap();
    }
}

async fn granted_hosts(app: &TestApp, lease_id: &str) -> Vec<String> {
    let lease = app
        .get(&format!("/v1/leases/{lease_id}?allocations=true"))
        .await
        .body;
    lease["lease"]["reservations"][0]["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["resource_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_disabled_compute_service_is_healed_around_and_comes_back() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1", "compute-2"]).await;
    let r = app
        .host_lease("future", "2030-02-01 10:00", "2030-02-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let before = granted_hosts(&app, &lease_id).await;
    assert_eq!(before.len(), 1);
    let (failing_id, failing_name) = if before[0] == ids[0] {
        (ids[0].clone(), "compute-1")
    } else {
        (ids[1].clone(), "compute-2")
    };

    // Nothing is wrong yet: the monitor changes nothing.
    assert_eq!(
        app.service.monitor_hosts().await.unwrap(),
        blazar_service::MonitorReport::default()
    );
    // Facts that drifted from Nova's are brought back in step.
    let nova_vcpus =
        app.get(&format!("/v1/os-hosts/{}", ids[0])).await.body["host"]["vcpus"].clone();
    let r = app
        .put(&format!("/v1/os-hosts/{}", ids[0]), json!({"vcpus": 1}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["host"]["vcpus"], 1);
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.refreshed, vec!["compute-1".to_string()]);
    let host = app.get(&format!("/v1/os-hosts/{}", ids[0])).await.body;
    assert_eq!(host["host"]["vcpus"], nova_vcpus);
    set_compute_enabled(&admin, failing_name, false).await;
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.failed, vec![failing_name.to_string()]);
    let host = app.get(&format!("/v1/os-hosts/{failing_id}")).await.body;
    assert_eq!(host["host"]["reservable"], false);
    let after = granted_hosts(&app, &lease_id).await;
    assert_eq!(after.len(), 1);
    assert_ne!(
        after[0], failing_id,
        "the reservation was not moved off the failed host"
    );

    set_compute_enabled(&admin, failing_name, true).await;
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.recovered, vec![failing_name.to_string()]);
    let host = app.get(&format!("/v1/os-hosts/{failing_id}")).await.body;
    assert_eq!(host["host"]["reservable"], true);

    // A host an operator took out stays out, whatever Nova says.
    let r = app
        .put(
            &format!("/v1/os-hosts/{failing_id}"),
            json!({"reservable": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        app.service.monitor_hosts().await.unwrap(),
        blazar_service::MonitorReport::default()
    );
    let host = app.get(&format!("/v1/os-hosts/{failing_id}")).await.body;
    assert_eq!(host["host"]["reservable"], false);

    assert_eq!(
        app.delete(&format!("/v1/leases/{lease_id}")).await.status,
        StatusCode::NO_CONTENT
    );
    withdraw(&app, &admin, &ids).await;
}

/// Healing takes a failed host from a running lease as Blazar does: out of the aggregate,
/// a replacement in; the servers on it stay (a compute service disabled or down for a
/// minute must not cost the lease its servers).
#[tokio::test]
async fn healing_a_running_lease_replaces_its_host_and_keeps_the_servers() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1", "compute-2"]).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .host_lease("healed", "2030-04-01 10:00", "2030-04-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as_admin();
    let (lease_id, rid) = lease_ids(&r);
    app.tick_at(t(2030, 4, 1, 10, 0)).await;
    let (status, _) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE");
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert_eq!(aggregate.hosts.len(), 1);
    let failing = aggregate.hosts[0].clone();
    let spare = if failing == "compute-1" {
        "compute-2"
    } else {
        "compute-1"
    };
    let (server, status) = boot(&env.member("alpha"), "survivor", Some(&rid)).await;
    assert_eq!(status, "ACTIVE");
    assert_eq!(server_host(&admin, &server).await, failing);

    set_compute_enabled(&admin, &failing, false).await;
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.failed, vec![failing.clone()]);
    app.run_actions().await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    assert_actions_done(&actions);
    assert_eq!(granted_hosts(&app, &lease_id).await.len(), 1);
    // The spare is the reservation's; the failed host is free in the database and in the
    // freepool, and stays in the aggregate (Nova keeps a host with servers in its zone),
    // open to its owner only, while the lease's server runs there.
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    let held: BTreeSet<String> = aggregate.hosts.iter().cloned().collect();
    assert_eq!(held, BTreeSet::from([failing.clone(), spare.to_string()]));
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts, vec![failing.clone()]);
    let kept = compute(&admin, Method::GET, &format!("/servers/{server}"), None).await;
    assert_eq!(kept["server"]["status"], "ACTIVE", "{kept}");
    assert_eq!(server_host(&admin, &server).await, failing);
    // The reconciler leaves them so, and says it left them (nothing to repair).
    let report = app.service.reconcile(true).await.unwrap();
    assert!(
        report
            .repairs
            .iter()
            .any(|l| l.contains(&failing) && l.contains("left while 1 server(s)")),
        "{report:?}"
    );
    assert_eq!(report.left.len(), 1, "{report:?}");
    assert_eq!(report.changes().count(), 0, "{report:?}");
    let kept = compute(&admin, Method::GET, &format!("/servers/{server}"), None).await;
    assert_eq!(kept["server"]["status"], "ACTIVE", "{kept}");
    // Granted to no one, the failed host still cannot be withdrawn while the lease's server
    // runs there (Blazar's HostHavingServers): it would be left in the aggregate, unenrolled.
    let failing_id = if failing == "compute-1" {
        &ids[0]
    } else {
        &ids[1]
    };
    let r = app.delete(&format!("/v1/os-hosts/{failing_id}")).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(
        r.message(),
        format!("Servers [{server}] found for host {failing}")
    );

    // The lease's end takes both hosts back, its server with them.
    set_compute_enabled(&admin, &failing, true).await;
    assert_eq!(
        app.delete(&format!("/v1/leases/{lease_id}")).await.status,
        StatusCode::NO_CONTENT
    );
    assert!(nova.find_aggregate(&rid).await.unwrap().is_none());
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts.len(), 2, "{:?}", freepool.hosts);
    let gone = compute(&admin, Method::GET, "/servers?all_tenants=1", None).await;
    assert!(gone["servers"].as_array().unwrap().is_empty(), "{gone}");
    withdraw(&app, &admin, &ids).await;
}

/// A failed host with no replacement stays in its running lease's aggregate while the
/// lease's server runs there; when the compute service is back the host is the lease's
/// again, handed back with its server (Blazar's healing never deletes them), the lease no
/// longer degraded.
#[tokio::test]
async fn a_host_handed_back_to_its_running_lease_keeps_the_leases_servers() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1"]).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .host_lease("back", "2030-04-02 10:00", "2030-04-02 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as_admin();
    let (lease_id, rid) = lease_ids(&r);
    app.tick_at(t(2030, 4, 2, 10, 0)).await;
    let (server, status) = boot(&env.member("alpha"), "stays", Some(&rid)).await;
    assert_eq!(status, "ACTIVE");
    assert_eq!(server_host(&admin, &server).await, "compute-1");

    set_compute_enabled(&admin, "compute-1", false).await;
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.failed, vec!["compute-1".to_string()]);
    app.run_actions().await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["degraded"], true, "{lease}");

    set_compute_enabled(&admin, "compute-1", true).await;
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.recovered, vec!["compute-1".to_string()]);
    app.run_actions().await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    assert_actions_done(&actions);
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["degraded"], false, "{lease}");
    assert_eq!(granted_hosts(&app, &lease_id).await, ids);
    let kept = compute(&admin, Method::GET, &format!("/servers/{server}"), None).await;
    assert_eq!(kept["server"]["status"], "ACTIVE", "{kept}");
    assert_eq!(server_host(&admin, &server).await, "compute-1");
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert_eq!(aggregate.hosts, vec!["compute-1".to_string()]);
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert!(freepool.hosts.is_empty(), "{:?}", freepool.hosts);

    // Its end takes the host back, the server with it.
    assert_eq!(
        app.delete(&format!("/v1/leases/{lease_id}")).await.status,
        StatusCode::NO_CONTENT
    );
    let gone = compute(&admin, Method::GET, "/servers?all_tenants=1", None).await;
    assert!(gone["servers"].as_array().unwrap().is_empty(), "{gone}");
    withdraw(&app, &admin, &ids).await;
}

#[tokio::test]
async fn a_lease_survives_a_broken_cloud() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    // The backend reaches Nova through a relay the test can cut.
    let compute_url = admin.session.endpoint("compute").await.unwrap();
    let authority = compute_url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let relay = Relay::to(authority.clone()).await;
    let mut config = env.session(
        &env.get("OS_SERVICE_USERNAME"),
        &env.get("OS_SERVICE_PASSWORD"),
        &env.get("OS_SERVICE_PROJECT_NAME"),
    );
    config.endpoint_overrides.insert(
        "compute".into(),
        compute_url.replace(&authority, &format!("127.0.0.1:{}", relay.port)),
    );
    config.timeout = Duration::from_secs(5);
    let backend = OpenStackBackend::new(Cloud::new(config).unwrap(), OpenStackSettings::default());
    let app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1", "compute-2"]).await;
    let r = app
        .host_lease("broken", "2030-03-01 10:00", "2030-03-01 12:00", 2, 2, "")
        .await;
    let (lease_id, rid) = lease_ids(&r);

    // Nova is unreachable when the lease starts: the hand-over waits and is retried.
    relay.set_cut(true);
    let start = t(2030, 3, 1, 10, 0);
    app.tick_at(start).await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["status"], "STARTING");
    let actions = app
        .get(&format!("/v1/leases/{lease_id}/actions"))
        .await
        .body;
    let start_action = actions["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "start")
        .unwrap()
        .clone();
    assert_eq!(start_action["status"], "pending");
    assert!(
        start_action["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("compute"),
        "{actions}"
    );
    // Nova is back; the retry falls due.
    relay.set_cut(false);
    app.clock.set(start + chrono::Duration::seconds(2));
    app.run_actions().await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["status"], "ACTIVE");
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert_eq!(aggregate.hosts.len(), 2);

    // Someone deletes the reservation's aggregate by hand: the end still completes and the
    // hosts go back to the freepool.
    for host in aggregate.hosts.clone() {
        let fresh = nova.find_aggregate(&rid).await.unwrap().unwrap();
        nova.remove_host(&fresh, &host).await.unwrap();
    }
    nova.delete_aggregate(&aggregate).await.unwrap();
    app.tick_at(t(2030, 3, 1, 12, 0)).await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    let actions = app
        .get(&format!("/v1/leases/{lease_id}/actions"))
        .await
        .body;
    assert_eq!(lease["lease"]["status"], "TERMINATED", "{actions}");
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts.len(), 2, "{:?}", freepool.hosts);
    withdraw(&app, &admin, &ids).await;
}

#[tokio::test]
async fn the_reconciler_repairs_what_was_broken_by_hand() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1", "compute-2", "compute-3"]).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    let r = app
        .host_lease("fixed", "2030-04-01 10:00", "2030-04-01 12:00", 2, 2, "")
        .await;
    let (lease_id, rid) = lease_ids(&r);
    app.tick_at(t(2030, 4, 1, 10, 0)).await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["status"], "ACTIVE");
    let reconcile = |dry_run: bool| reconcile_repairs(&app, dry_run);
    assert_eq!(
        reconcile(true).await,
        Vec::<String>::new(),
        "drift before any"
    );

    // Break it by hand: a reserved host out of its aggregate, the owner changed and another
    // project admitted (BlazarFilter admits a project whose id is a key), the zone changed,
    // an unreserved host out of the freepool and its provider for instance slots deleted,
    // an aggregate of no reservation of this database.
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    let taken = aggregate.hosts[0].clone();
    nova.remove_host(&aggregate, &taken).await.unwrap();
    let intruder = "0badc0de0badc0de0badc0de0badc0de";
    let mut metadata = serde_json::Map::new();
    metadata.insert("blazar:owner".into(), json!("someone-else"));
    metadata.insert(intruder.into(), json!("true"));
    nova.set_metadata(&aggregate, metadata).await.unwrap();
    nova.set_zone(&aggregate, "anyone").await.unwrap();
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    let spare = freepool.hosts[0].clone();
    nova.remove_host(&freepool, &spare).await.unwrap();
    let placement = admin.placement(None);
    let spare_slots = format!("blazar_{spare}");
    let provider = placement.provider_by_name(&spare_slots).await.unwrap();
    placement
        .delete_provider(&provider.expect("enrolled").uuid)
        .await
        .unwrap();
    nova.ensure_aggregate("stale", Some("blazar_stale"))
        .await
        .unwrap();

    let drift = reconcile(true).await;
    assert_eq!(drift.len(), 6, "{drift:#?}");
    assert!(
        drift.contains(&format!(
            "provider {spare_slots} of host {spare} missing: created"
        )),
        "{drift:#?}"
    );
    assert!(
        drift
            .iter()
            .any(|l| l.contains(intruder) && l.contains("blazar:owner")),
        "{drift:#?}"
    );
    assert!(
        drift.iter().any(|l| l.contains("availability zone anyone")),
        "{drift:#?}"
    );
    // A dry run changes nothing.
    let still = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert!(!still.hosts.contains(&taken));
    let repaired = reconcile(false).await;
    assert_eq!(repaired, drift);
    let fixed = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert!(fixed.hosts.contains(&taken), "{:?}", fixed.hosts);
    assert_eq!(
        fixed.metadata["blazar:owner"],
        json!(alpha_or_admin(&lease))
    );
    assert!(
        !fixed.metadata.contains_key(intruder),
        "{:?}",
        fixed.metadata
    );
    assert_eq!(
        fixed.availability_zone.as_deref(),
        Some(format!("blazar_{rid}").as_str())
    );
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts, vec![spare.clone()]);
    let node = placement.provider_by_name(&spare).await.unwrap().unwrap();
    let remade = placement.provider_by_name(&spare_slots).await.unwrap();
    assert_eq!(
        remade.expect("made again").parent.as_deref(),
        Some(node.uuid.as_str())
    );
    // An aggregate in Blazar's zones of no reservation this database had (another
    // Blazar's lease that has not started has one, empty) is listed and left.
    assert!(
        drift.iter().any(|l| l
            == "aggregate stale in Blazar's zones belongs to no reservation of this database: \
                left"),
        "{drift:#?}"
    );
    let stale = nova.find_aggregate("stale").await.unwrap().expect("left");
    nova.delete_aggregate(&stale).await.unwrap();
    assert_eq!(
        reconcile(true).await,
        Vec::<String>::new(),
        "drift after repair"
    );

    // The aggregate of an active lease deleted by hand comes back with its hosts.
    let fixed = nova.find_aggregate(&rid).await.unwrap().unwrap();
    for host in fixed.hosts.clone() {
        let now = nova.find_aggregate(&rid).await.unwrap().unwrap();
        nova.remove_host(&now, &host).await.unwrap();
    }
    nova.delete_aggregate(&fixed).await.unwrap();
    // The aggregate, its owner and its two hosts.
    let repaired = reconcile(false).await;
    assert_eq!(repaired.len(), 4, "{repaired:#?}");
    let back = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert_eq!(back.hosts.len(), 2);
    assert_eq!(
        back.availability_zone.as_deref(),
        Some(format!("blazar_{rid}").as_str())
    );

    // A reserved host moved into another availability zone cannot be put back (Nova keeps a
    // host in one zone): that repair is reported as failed, not as made, and the rest of the
    // pass goes on (the spare host goes back to the freepool).
    let moved = back.hosts[0].clone();
    nova.remove_host(&back, &moved).await.unwrap();
    let elsewhere = nova
        .ensure_aggregate("elsewhere", Some("other-zone"))
        .await
        .unwrap();
    nova.add_host(&elsewhere, &moved).await.unwrap();
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    nova.remove_host(&freepool, &spare).await.unwrap();
    let report = reconcile_report(&app, false).await;
    // Listed under failed only; the freepool's repair was made.
    let repairs = report_lines(&report, "repairs");
    assert_eq!(repairs.len(), 1, "{report}");
    assert!(repairs[0].contains(&spare), "{repairs:?}");
    let failed = report_lines(&report, "failed");
    assert_eq!(failed.len(), 1, "{report}");
    assert!(
        failed[0].contains(&moved) && failed[0].contains("409"),
        "{failed:?}"
    );
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts, vec![spare.clone()]);
    let still = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert!(!still.hosts.contains(&moved), "{:?}", still.hosts);
    // Once the other zone lets it go, the next pass puts it back.
    let elsewhere = nova.find_aggregate("elsewhere").await.unwrap().unwrap();
    nova.remove_host(&elsewhere, &moved).await.unwrap();
    nova.delete_aggregate(&elsewhere).await.unwrap();
    let repaired = reconcile(false).await;
    assert_eq!(repaired.len(), 1, "{repaired:#?}");
    let back = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert!(back.hosts.contains(&moved), "{:?}", back.hosts);

    // Moved by hand into another aggregate of Blazar's zones (another reservation's, or
    // one of no reservation): taken out of it and put back in the same pass, never left
    // in no pool for a pass (Nova would refuse the put-back while the host is there).
    nova.remove_host(&back, &moved).await.unwrap();
    let intruder_zone = nova
        .ensure_aggregate("not-a-reservation", Some("blazar_not-a-reservation"))
        .await
        .unwrap();
    nova.add_host(&intruder_zone, &moved).await.unwrap();
    let report = reconcile_report(&app, false).await;
    assert_eq!(report["failed"], json!([]), "{report}");
    let back = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert!(back.hosts.contains(&moved), "{:?}", back.hosts);
    // The aggregate is no reservation of this database's: it loses the enrolled host and
    // is otherwise left, for whoever made it.
    let left = nova
        .find_aggregate("not-a-reservation")
        .await
        .unwrap()
        .expect("left");
    assert!(left.hosts.is_empty(), "{:?}", left.hosts);
    nova.delete_aggregate(&left).await.unwrap();

    // A lease not started yet: its aggregate exists, empty and owned. A host added to it by
    // hand is taken out (and stays in the freepool), its owner put back; the aggregate
    // stays. Deleted by hand, it is made again.
    let later = app
        .host_lease("later", "2030-04-02 10:00", "2030-04-02 12:00", 1, 1, "")
        .await;
    assert_eq!(later.status, StatusCode::CREATED, "{}", later.body);
    let (later_id, later_rid) = lease_ids(&later);
    wait_idle(&app).await;
    assert_eq!(reconcile(true).await, Vec::<String>::new(), "drift before");
    let prepared = nova.find_aggregate(&later_rid).await.unwrap().unwrap();
    nova.add_host(&prepared, &spare).await.unwrap();
    let mut metadata = serde_json::Map::new();
    metadata.insert("blazar:owner".into(), json!("someone-else"));
    nova.set_metadata(&prepared, metadata).await.unwrap();
    let drift = reconcile(true).await;
    assert_eq!(drift.len(), 2, "{drift:#?}");
    assert!(
        drift
            .iter()
            .any(|l| l.contains(&spare) && l.contains("taken out")),
        "{drift:#?}"
    );
    assert_eq!(reconcile(false).await, drift);
    let kept = nova.find_aggregate(&later_rid).await.unwrap().unwrap();
    assert!(kept.hosts.is_empty(), "{:?}", kept.hosts);
    assert_eq!(
        kept.metadata["blazar:owner"],
        json!(alpha_or_admin(&later.body))
    );
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts, vec![spare.clone()]);
    nova.delete_aggregate(&kept).await.unwrap();
    // The aggregate and its owner.
    let repaired = reconcile(false).await;
    assert_eq!(repaired.len(), 2, "{repaired:#?}");
    let remade = nova.find_aggregate(&later_rid).await.unwrap().unwrap();
    assert!(remade.hosts.is_empty(), "{:?}", remade.hosts);
    assert_eq!(
        remade.metadata["blazar:owner"],
        json!(alpha_or_admin(&later.body))
    );
    assert_eq!(
        remade.availability_zone.as_deref(),
        Some(format!("blazar_{later_rid}").as_str())
    );
    assert_eq!(reconcile(true).await, Vec::<String>::new(), "drift after");
    let r = app.delete(&format!("/v1/leases/{later_id}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    wait_idle(&app).await;
    assert!(nova.find_aggregate(&later_rid).await.unwrap().is_none());

    // Only admins may reconcile.
    app.act_as(&alpha, "alpha-user", "member");
    let r = app.post("/v1/reconcile", json!({})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    app.act_as_admin();

    app.tick_at(t(2030, 4, 1, 12, 0)).await;
    withdraw(&app, &admin, &ids).await;
}

/// A host whose compute service Nova no longer has (deleted by an operator) is put into no
/// aggregate: Nova would record the add and then fail it, keeping the host a member that no
/// call can take out. The pass lists it as left, and asks Nova nothing for it.
#[tokio::test]
async fn the_reconciler_puts_a_host_nova_no_longer_has_into_no_aggregate() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let app = TestApp::spawn_backend(Arc::new(backend)).await;
    enrol(&app, &["compute-1"]).await;
    enrol_gone_host(&app).await;
    assert!(nova.has_compute_service("compute-1").await.unwrap());
    assert!(!nova.has_compute_service("compute-gone").await.unwrap());
    let left = "host compute-gone has no compute service in Nova: left out of freepool";
    for dry_run in [true, false] {
        let report = reconcile_report(&app, dry_run).await;
        assert_eq!(report_lines(&report, "repairs"), vec![left], "{report}");
        assert_eq!(
            report_lines(&report, "failed"),
            Vec::<String>::new(),
            "{report}"
        );
    }
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts, vec!["compute-1".to_string()]);
}

/// Enrols `compute-gone` in the database only: a host enrolled while Nova had it, its
/// compute service deleted since.
async fn enrol_gone_host(app: &TestApp) {
    let mut tx = app.service.store().write().await.unwrap();
    tx.insert_host(&blazar_db::NewHost {
        facts: blazar_core::HostFacts {
            hypervisor_hostname: "compute-gone".into(),
            service_name: "compute-gone".into(),
            hypervisor_type: "fake".into(),
            hypervisor_version: 1,
            vcpus: 2,
            memory_mb: 2048,
            local_gb: 20,
            cpu_info: String::new(),
            availability_zone: "nova".into(),
        },
        trust_id: String::new(),
        capabilities: Default::default(),
        created_at: chrono::Utc::now(),
    })
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// Puts compute node `node`'s provider into Placement's copy of aggregate `uuid` or takes
/// it out, as Nova's mirroring does (or fails to do while Placement is down).
async fn set_placement_member(admin: &Cloud, node: &str, uuid: &str, member: bool) {
    edit_provider_set(admin, node, "aggregates", uuid, member).await;
}

/// The names of the providers in Placement's copy of aggregate `uuid`.
async fn placement_members(admin: &Cloud, uuid: &str) -> BTreeSet<String> {
    admin
        .placement(None)
        .providers_in_aggregate(uuid)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect()
}

/// Nova copies each host it adds to or removes from an aggregate into Placement, but not
/// while Placement is down (it keeps its own change and answers 500): the reconciler puts
/// Placement's copy of the freepool and of the reservations' aggregates back in line with
/// Nova, and leaves other providers an operator put in them (a sharing provider) alone.
#[tokio::test]
async fn the_reconciler_puts_placements_copy_of_the_aggregates_back_in_line() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1", "compute-2", "compute-3"]).await;
    let r = app
        .host_lease("fixed", "2030-04-01 10:00", "2030-04-01 12:00", 1, 1, "")
        .await;
    let (lease_id, rid) = lease_ids(&r);
    app.tick_at(t(2030, 4, 1, 10, 0)).await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["status"], "ACTIVE");
    let reconcile = |dry_run: bool| {
        let app = &app;
        async move {
            let report = reconcile_report(app, dry_run).await;
            assert_eq!(report["failed"], json!([]), "{report}");
            report_lines(&report, "repairs")
        }
    };
    // The fake driver's compute nodes are named as their hosts.
    let as_set = |hosts: &[String]| hosts.iter().cloned().collect::<BTreeSet<_>>();
    let leased = nova.find_aggregate(&rid).await.unwrap().unwrap();
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(leased.hosts.len(), 1);
    assert_eq!(freepool.hosts.len(), 2);
    assert_eq!(
        placement_members(&admin, &leased.uuid).await,
        as_set(&leased.hosts)
    );
    assert_eq!(
        placement_members(&admin, &freepool.uuid).await,
        as_set(&freepool.hosts)
    );
    assert_eq!(reconcile(true).await, Vec::<String>::new());

    // What Nova leaves when Placement did not answer: the leased host's add not copied,
    // a free host's removal from the reservation's aggregate not copied, another free
    // host's add to the freepool not copied. And a sharing provider put by an operator
    // into the freepool's copy.
    let taken = leased.hosts[0].clone();
    let (spare, other) = (freepool.hosts[0].clone(), freepool.hosts[1].clone());
    set_placement_member(&admin, &taken, &leased.uuid, false).await;
    set_placement_member(&admin, &spare, &leased.uuid, true).await;
    set_placement_member(&admin, &other, &freepool.uuid, false).await;
    let shared = format!("shared-disk-{}", &rid[..8]);
    let made = placement_call(
        &admin,
        Method::POST,
        "/resource_providers",
        Some(json!({ "name": shared })),
    )
    .await;
    let shared_uuid = made["uuid"].as_str().unwrap().to_string();
    set_placement_member(&admin, &shared, &freepool.uuid, true).await;

    let drift = reconcile(true).await;
    assert_eq!(drift.len(), 3, "{drift:#?}");
    for host in [&taken, &spare, &other] {
        assert!(
            drift
                .iter()
                .any(|l| l.contains(&format!("host {host} ")) && l.contains("Placement")),
            "{host}: {drift:#?}"
        );
    }
    // A dry run changes nothing.
    assert!(
        !placement_members(&admin, &leased.uuid)
            .await
            .contains(&taken)
    );
    let repaired = reconcile(false).await;
    assert_eq!(repaired, drift);
    assert_eq!(
        placement_members(&admin, &leased.uuid).await,
        as_set(&leased.hosts)
    );
    let mut pooled = as_set(&freepool.hosts);
    pooled.insert(shared.clone());
    assert_eq!(placement_members(&admin, &freepool.uuid).await, pooled);
    assert_eq!(reconcile(true).await, Vec::<String>::new());

    placement_call(
        &admin,
        Method::DELETE,
        &format!("/resource_providers/{shared_uuid}"),
        None,
    )
    .await;
    app.tick_at(t(2030, 4, 1, 12, 0)).await;
    withdraw(&app, &admin, &ids).await;
}

/// `scripts/openstack/service.sh STATE name what` (`stop` or `start`).
fn service_sh(name: &str, what: &str) -> std::process::ExitStatus {
    let state = std::env::var("BLAZAR_TEST_OPENSTACK_STATE").unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/openstack/service.sh"
    );
    std::process::Command::new(script)
        .args([state.as_str(), name, what])
        .status()
        .unwrap()
}

/// One service of the cloud taken away until [`Outage::end`], or until the guard drops: a
/// test that fails during the outage still brings the service back for the tests after it.
struct Outage {
    name: &'static str,
    over: bool,
}

impl Outage {
    fn begin(name: &'static str) -> Outage {
        let status = service_sh(name, "stop");
        assert!(status.success(), "service.sh {name} stop: {status}");
        Outage { name, over: false }
    }

    fn end(mut self) {
        self.over = true;
        let status = service_sh(self.name, "start");
        assert!(status.success(), "service.sh {} start: {status}", self.name);
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        if !self.over {
            let _ = service_sh(self.name, "start");
        }
    }
}

/// Placement down while a host lease starts and while it ends: Nova moves the host in its
/// own database, answers 500 and leaves Placement's copy of the aggregates as it was. The
/// start and the end are retried once Placement is back, find the host moved, and bring
/// Placement's copy in line themselves (without waiting for the reconciler).
#[tokio::test]
async fn placement_down_at_a_hand_over_leaves_its_copy_of_the_aggregates_right() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1", "compute-2"]).await;
    let r = app
        .host_lease("outage", "2030-05-01 10:00", "2030-05-01 12:00", 1, 1, "")
        .await;
    let (lease_id, rid) = lease_ids(&r);
    let placement_back = || async {
        for _ in 0..240 {
            if admin
                .placement(None)
                .provider_by_name("compute-1")
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("Placement did not come back within 60 s");
    };
    let open_action = |kind: &'static str| {
        let app = &app;
        let lease_id = lease_id.clone();
        async move {
            let actions = app
                .get(&format!("/v1/leases/{lease_id}/actions"))
                .await
                .body;
            actions["actions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["kind"] == kind)
                .map(|a| a["status"].as_str().unwrap().to_string())
                .unwrap()
        }
    };
    let as_set = |hosts: &[String]| hosts.iter().cloned().collect::<BTreeSet<_>>();

    let outage = Outage::begin("placement");
    let start = t(2030, 5, 1, 10, 0);
    app.tick_at(start).await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["status"], "STARTING");
    assert_eq!(open_action("start").await, "pending");
    // Nova kept its half: the host is in the reservation's aggregate.
    let leased = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert_eq!(leased.hosts.len(), 1, "{:?}", leased.hosts);
    outage.end();
    placement_back().await;
    assert!(
        placement_members(&admin, &leased.uuid).await.is_empty(),
        "Nova copied the host after all: the outage broke nothing"
    );
    app.clock.set(start + chrono::Duration::seconds(2));
    app.run_actions().await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["status"], "ACTIVE");
    let leased = nova.find_aggregate(&rid).await.unwrap().unwrap();
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(
        placement_members(&admin, &leased.uuid).await,
        as_set(&leased.hosts)
    );
    assert_eq!(
        placement_members(&admin, &freepool.uuid).await,
        as_set(&freepool.hosts)
    );

    let outage = Outage::begin("placement");
    let end = t(2030, 5, 1, 12, 0);
    app.tick_at(end).await;
    assert_eq!(open_action("stop").await, "pending");
    outage.end();
    placement_back().await;
    app.clock.set(end + chrono::Duration::seconds(2));
    app.run_actions().await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(lease["lease"]["status"], "TERMINATED");
    assert!(nova.find_aggregate(&rid).await.unwrap().is_none());
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert_eq!(freepool.hosts.len(), 2);
    assert_eq!(
        placement_members(&admin, &freepool.uuid).await,
        as_set(&freepool.hosts)
    );
    assert!(placement_members(&admin, &leased.uuid).await.is_empty());
    withdraw(&app, &admin, &ids).await;
}

/// The ids of the lease a create answered, and of its first reservation.
/// Placement down when a lease ends: Nova accepts the delete of the lease's server, then
/// fails it (the compute service cannot free the server's allocation) and leaves the server
/// in ERROR. The end deletes it again while it waits, so it finishes soon after Placement
/// is back, not when `server_delete_timeout` runs out.
#[tokio::test]
async fn an_end_deletes_again_a_server_whose_delete_failed() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let settings = OpenStackSettings {
        server_delete_timeout: Duration::from_secs(180),
        ..OpenStackSettings::default()
    };
    let backend = OpenStackBackend::new(env.service(), settings);
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let ids = enrol(&app, &["compute-1"]).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .host_lease("ends", "2030-06-01 10:00", "2030-06-01 12:00", 1, 1, "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as_admin();
    let (lease_id, rid) = lease_ids(&r);
    app.tick_at(t(2030, 6, 1, 10, 0)).await;
    let (status, _) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE");
    let (server, status) = boot(&env.member("alpha"), "doomed", Some(&rid)).await;
    assert_eq!(status, "ACTIVE");

    let outage = Outage::begin("placement");
    // Placement comes back once Nova has given up the delete.
    let failed = {
        let admin = env.admin();
        let server = server.clone();
        tokio::spawn(async move {
            let mut failed = false;
            for _ in 0..240 {
                let s = compute(&admin, Method::GET, &format!("/servers/{server}"), None).await;
                if s["server"]["status"] == "ERROR"
                    && s["server"]["OS-EXT-STS:task_state"].is_null()
                {
                    failed = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            outage.end();
            failed
        })
    };
    let began = std::time::Instant::now();
    app.tick_at(t(2030, 6, 1, 12, 0)).await;
    let took = began.elapsed();
    assert!(
        failed.await.unwrap(),
        "Nova deleted the server with Placement down: nothing failed"
    );
    let (status, actions) = lease_status(&app, &lease_id).await;
    // Ended in the one attempt the tick ran: without the delete asked again, that attempt
    // waits out the 180 s and fails, and the lease is still TERMINATING (no timing asserted).
    assert_eq!(status, "TERMINATED", "after {took:?}: {actions}");
    let gone = compute(&admin, Method::GET, "/servers?all_tenants=1", None).await;
    assert!(gone["servers"].as_array().unwrap().is_empty(), "{gone}");
    assert!(nova.find_aggregate(&rid).await.unwrap().is_none());
    withdraw(&app, &admin, &ids).await;
}

fn lease_ids(created: &blazar_testkit::Response) -> (String, String) {
    let lease = &created.body["lease"];
    let id = |v: &Value| v.as_str().unwrap().to_string();
    (id(&lease["id"]), id(&lease["reservations"][0]["id"]))
}

/// One reconciler pass through the API (`dry_run`: only listed): its report.
async fn reconcile_report(app: &TestApp, dry_run: bool) -> Value {
    let r = app
        .post("/v1/reconcile", json!({ "dry_run": dry_run }))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["reconcile"].clone()
}

/// The lines of a reconciler report under `key` (`repairs`, `failed`).
fn report_lines(report: &Value, key: &str) -> Vec<String> {
    report[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

/// What a reconciler pass found (and, unless `dry_run`, repaired).
async fn reconcile_repairs(app: &TestApp, dry_run: bool) -> Vec<String> {
    report_lines(&reconcile_report(app, dry_run).await, "repairs")
}

/// The project the lease belongs to (the test creates it as the noauth admin).
fn alpha_or_admin(lease: &Value) -> String {
    lease["lease"]["project_id"].as_str().unwrap().to_string()
}

/// The real backend, counting how often each action reaches it.
struct Counted {
    inner: OpenStackBackend,
    calls: Arc<std::sync::Mutex<HashMap<i64, usize>>>,
}

#[async_trait::async_trait]
impl blazar_service::Backend for Counted {
    async fn apply(
        &self,
        store: &blazar_db::Store,
        action: &blazar_service::Action,
    ) -> Result<blazar_service::ActionOutput, blazar_service::ActionError> {
        *self.calls.lock().unwrap().entry(action.seq).or_default() += 1;
        self.inner.apply(store, action).await
    }

    async fn describe_host(
        &self,
        name: &str,
    ) -> Result<Option<blazar_core::HostFacts>, blazar_service::InventoryError> {
        self.inner.describe_host(name).await
    }

    fn acts_on_inventory(&self) -> bool {
        true
    }

    fn prepares_reservations(&self) -> bool {
        true
    }
}

/// Until no action is open: the test clock jumps by hours, which would expire the claims of
/// actions still running (and have them run again, as after a worker's death).
async fn wait_idle(app: &TestApp) {
    for _ in 0..600 {
        let mut tx = app.service.store().read().await.unwrap();
        let open = tx
            .list_actions(&blazar_core::ActionFilter {
                statuses: vec![
                    blazar_core::ActionStatus::Pending,
                    blazar_core::ActionStatus::Running,
                ],
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        drop(tx);
        if open.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("actions still open after 60 s");
}

/// Every action of a lease's actions list (`lease_status`'s second part) is done.
fn assert_actions_done(actions: &Value) {
    assert!(
        actions["actions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["status"] == "done"),
        "{actions}"
    );
}

async fn wait_for_status(app: &TestApp, leases: &[String], status: &str) {
    for _ in 0..600 {
        let mut all = true;
        for l in leases {
            all &= app.get(&format!("/v1/leases/{l}")).await.body["lease"]["status"] == status;
        }
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the leases did not all become {status} within 60 s");
}

#[tokio::test]
async fn two_replicas_carry_out_each_action_once_on_the_cloud() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let calls = Arc::new(std::sync::Mutex::new(HashMap::new()));
    let counted = || {
        Arc::new(Counted {
            inner: OpenStackBackend::new(env.service(), OpenStackSettings::default()),
            calls: calls.clone(),
        })
    };
    let mut app = TestApp::spawn_backend(counted()).await;
    let mut replica = app.replica_with(counted()).await;
    app.auto_actions = false;
    replica.auto_actions = false;
    let start = t(2030, 5, 1, 10, 0);
    replica.clock.set(start - chrono::Duration::hours(1));
    app.clock.set(start - chrono::Duration::hours(1));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for service in [app.service.clone(), replica.service.clone()] {
        let mut rx = stop_rx.clone();
        workers.push(tokio::spawn(async move {
            service
                .run_workers(Duration::from_millis(50), async move {
                    let _ = rx.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    let ids = enrol(&app, &["compute-1", "compute-2", "compute-3"]).await;
    let mut leases = Vec::new();
    for i in 0..3 {
        // Alternate replicas for the requests too.
        let via = if i % 2 == 0 { &app } else { &replica };
        let r = via
            .host_lease(
                &format!("r{i}"),
                "2030-05-01 10:00",
                "2030-05-01 12:00",
                1,
                1,
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        leases.push(r.body["lease"]["id"].as_str().unwrap().to_string());
    }
    wait_idle(&app).await;
    app.clock.set(start);
    replica.clock.set(start);
    app.service.tick(start).await.unwrap();
    wait_for_status(&app, &leases, "ACTIVE").await;
    let reserved: usize = nova
        .aggregates()
        .await
        .unwrap()
        .iter()
        .filter(|a| a.name != "freepool")
        .map(|a| a.hosts.len())
        .sum();
    assert_eq!(reserved, 3);
    wait_idle(&app).await;
    let end = t(2030, 5, 1, 12, 0);
    app.clock.set(end);
    replica.clock.set(end);
    replica.service.tick(end).await.unwrap();
    wait_for_status(&app, &leases, "TERMINATED").await;
    for id in &ids {
        assert_eq!(
            app.delete(&format!("/v1/os-hosts/{id}")).await.status,
            StatusCode::NO_CONTENT
        );
    }
    // Let the workers take the withdrawals, then stop them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_tx.send(true).unwrap();
    for w in workers {
        w.await.unwrap();
    }
    let calls = calls.lock().unwrap().clone();
    // 3 enrol + 3 prepare + 3 start + 3 stop + 3 withdraw.
    assert_eq!(calls.len(), 15, "{calls:?}");
    if !calls.values().all(|&n| n == 1) {
        let mut tx = app.service.store().read().await.unwrap();
        let rows = tx
            .list_actions(&blazar_core::ActionFilter {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        let why: Vec<String> = rows
            .iter()
            .map(|a| {
                format!(
                    "{} {} {} attempts={} error={:?}",
                    a.seq, a.intent.kind, a.status, a.attempts, a.last_error
                )
            })
            .collect();
        panic!("an action ran twice: {calls:?}\n{}", why.join("\n"));
    }
    let freepool = nova.find_aggregate("freepool").await.unwrap().unwrap();
    assert!(freepool.hosts.is_empty(), "{:?}", freepool.hosts);
    assert_eq!(
        nova.aggregates().await.unwrap().len(),
        1,
        "only the freepool is left"
    );
    drop(replica);
}

/// A token of `user` in `project` (names; domain Default).
async fn token(env: &Env, user: &str, password: &str, project: &str) -> String {
    let r = reqwest::Client::new()
        .post(format!("{}/auth/tokens", env.get("OS_AUTH_URL")))
        .json(&json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": user, "domain": {"name": "Default"}, "password": password}}},
            "scope": {"project": {"name": project, "domain": {"name": "Default"}}}}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.headers()["x-subject-token"].to_str().unwrap().to_string()
}

/// The real binary as the README deploys it against the cloud (`--auth keystone --backend
/// openstack`, the service user's password in the environment), its database in `dir`,
/// with `extra` options; and its API's base URL.
async fn start_binary(
    env: &Env,
    dir: &tempfile::TempDir,
    extra: &[&str],
) -> (crate::support::ServerProcess, String) {
    let db = dir.path().join("blazar.db").display().to_string();
    let listen = format!("127.0.0.1:{}", crate::support::free_port());
    let password = env.get("OS_SERVICE_PASSWORD");
    let auth_url = env.get("OS_AUTH_URL");
    let mut args = vec![
        "--auth",
        "keystone",
        "--backend",
        "openstack",
        "--keystone-url",
        auth_url.as_str(),
        "--keystone-username",
        "blazar",
        "--os-region",
        "RegionOne",
        "--listen",
        listen.as_str(),
        "--database-url",
        db.as_str(),
    ];
    args.extend_from_slice(extra);
    let server = crate::support::ServerProcess::start_with_env(
        &args,
        &[("BLAZAR_KEYSTONE_PASSWORD", password.as_str())],
    )
    .await;
    (server, format!("http://{listen}/v1"))
}

/// The deployment the README walks through: the real binary with `--auth keystone
/// --backend openstack`, its own scheduler, workers, monitor and reconciler, real tokens,
/// the real clock.
#[tokio::test]
async fn the_binary_deployed_as_the_readme_says() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let dir = tempfile::tempdir().unwrap();
    let (server, base) = start_binary(
        &env,
        &dir,
        &["--monitor-interval", "2", "--reconcile-interval", "2"],
    )
    .await;
    let http = reqwest::Client::new();
    let admin_token = token(
        &env,
        &env.get("OS_USERNAME"),
        &env.get("OS_PASSWORD"),
        &env.get("OS_PROJECT_NAME"),
    )
    .await;
    let alpha_token = token(&env, "alpha-member", &env.get("OS_USER_PASSWORD"), "alpha").await;

    let r = http
        .post(format!("{base}/os-hosts"))
        .header("x-auth-token", &admin_token)
        .json(&json!({"name": "compute-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let host: Value = r.json().await.unwrap();
    let host_id = host["host"]["id"].as_str().unwrap().to_string();
    let r = http
        .post(format!("{base}/leases"))
        .header("x-auth-token", &alpha_token)
        .json(
            &json!({"name": "now", "start_date": "now", "end_date": "2040-01-01 00:00",
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                "hypervisor_properties": "", "resource_properties": ""}], "events": []}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let lease: Value = r.json().await.unwrap();
    let lease_id = lease["lease"]["id"].as_str().unwrap().to_string();
    let rid = lease["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut status = String::new();
    for _ in 0..300 {
        let l: Value = http
            .get(format!("{base}/leases/{lease_id}"))
            .header("x-auth-token", &alpha_token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        status = l["lease"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if status == "ACTIVE" || status == "ERROR" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "ACTIVE", "{}", server.logs());
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert_eq!(aggregate.hosts, vec!["compute-1".to_string()]);

    // Drift made by hand is repaired by the periodic reconciler.
    nova.remove_host(&aggregate, "compute-1").await.unwrap();
    let mut repaired = false;
    for _ in 0..100 {
        let a = nova.find_aggregate(&rid).await.unwrap().unwrap();
        if a.hosts == vec!["compute-1".to_string()] {
            repaired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(repaired, "{}", server.logs());

    // The owner deletes the lease: the host goes back, the aggregate goes.
    let r = http
        .delete(format!("{base}/leases/{lease_id}"))
        .header("x-auth-token", &alpha_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let mut back = false;
    for _ in 0..300 {
        let gone = nova.find_aggregate(&rid).await.unwrap().is_none();
        let pooled = nova
            .find_aggregate("freepool")
            .await
            .unwrap()
            .is_some_and(|f| f.hosts == vec!["compute-1".to_string()]);
        if gone && pooled {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "{}", server.logs());
    let r = http
        .delete(format!("{base}/os-hosts/{host_id}"))
        .header("x-auth-token", &admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let logs = server.stop().await;
    assert!(logs.contains("reconciler repaired drift"), "{logs}");
}

/// Blazar's notification monitor, and more: with `--monitor-notifications`, the binary
/// reads Nova's notifications from the cloud's broker. A compute service disabled is healed
/// around at once, and a host an operator takes out of its reservation's aggregate is put
/// back at once. The timed monitor runs once at start and then not for an hour, the
/// reconciler not for an hour either, so only Nova's notifications can explain the changes
/// within seconds.
#[tokio::test]
async fn the_binary_heals_as_soon_as_nova_says_a_compute_service_changed() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let dir = tempfile::tempdir().unwrap();
    let transport = env.get("CLOUD_TRANSPORT_URL");
    let extra = [
        "--monitor-interval",
        "3600",
        "--reconcile-interval",
        "3600",
        "--monitor-notifications",
        "true",
        "--monitor-transport-url",
        transport.as_str(),
    ];
    let (server, base) = start_binary(&env, &dir, &extra).await;
    let http = reqwest::Client::new();
    let admin_token = token(
        &env,
        &env.get("OS_USERNAME"),
        &env.get("OS_PASSWORD"),
        &env.get("OS_PROJECT_NAME"),
    )
    .await;
    let alpha_token = token(&env, "alpha-member", &env.get("OS_USER_PASSWORD"), "alpha").await;
    let mut host_ids = HashMap::new();
    for name in ["compute-1", "compute-2"] {
        let r = http
            .post(format!("{base}/os-hosts"))
            .header("x-auth-token", &admin_token)
            .json(&json!({ "name": name }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let host: Value = r.json().await.unwrap();
        host_ids.insert(name, host["host"]["id"].as_str().unwrap().to_string());
    }
    let r = http
        .post(format!("{base}/leases"))
        .header("x-auth-token", &alpha_token)
        .json(
            &json!({"name": "heard", "start_date": "now", "end_date": "2040-01-01 00:00",
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                "hypervisor_properties": "", "resource_properties": ""}], "events": []}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let lease: Value = r.json().await.unwrap();
    let lease_id = lease["lease"]["id"].as_str().unwrap().to_string();
    let rid = lease["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Started, and the listener's queue bound (a change before that is not heard).
    let mut held = Vec::new();
    for _ in 0..300 {
        let listening = server.logs().contains("listening to Nova's notifications");
        if let Ok(Some(a)) = nova.find_aggregate(&rid).await {
            held = a.hosts;
        }
        if listening && held.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(held.len(), 1, "{}", server.logs());
    let failing = held[0].clone();
    let other = if failing == "compute-1" {
        "compute-2"
    } else {
        "compute-1"
    };
    let reservable = async |name: &str| -> bool {
        let r = http
            .get(format!("{base}/os-hosts/{}", host_ids[name]))
            .header("x-auth-token", &admin_token)
            .send()
            .await
            .unwrap();
        let host: Value = r.json().await.unwrap();
        host["host"]["reservable"].as_bool().unwrap()
    };
    assert!(reservable(&failing).await);

    // The operator disables the compute service: Nova says so, the host is taken out and
    // the lease healed onto the other one, long before the monitor's next timed pass.
    set_compute_enabled(&admin, &failing, false).await;
    let mut out = false;
    for _ in 0..200 {
        if !reservable(&failing).await {
            out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        out,
        "the disabled host is still reservable: {}",
        server.logs()
    );
    // Healed: the other host in, and the failed one out (the take-back of the failed host
    // may finish after the hand-over of the other).
    let mut moved = false;
    for _ in 0..300 {
        if let Ok(Some(a)) = nova.find_aggregate(&rid).await
            && a.hosts == vec![other.to_string()]
        {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        moved,
        "the lease was not healed onto {other} alone: {}",
        server.logs()
    );

    // Enabled again: Nova says so too, and the host is reservable again.
    set_compute_enabled(&admin, &failing, true).await;
    let mut back = false;
    for _ in 0..200 {
        if reservable(&failing).await {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "the enabled host stayed out: {}", server.logs());

    // An operator takes the lease's host out of its aggregate by hand: BlazarFilter would
    // let any project onto it. Nova says so, and the reconciler puts it back.
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    assert_eq!(aggregate.hosts, vec![other.to_string()]);
    nova.remove_host(&aggregate, other).await.unwrap();
    let mut repaired = false;
    for _ in 0..300 {
        if let Ok(Some(a)) = nova.find_aggregate(&rid).await
            && a.hosts == vec![other.to_string()]
        {
            repaired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(repaired, "the host was not put back: {}", server.logs());

    let r = http
        .delete(format!("{base}/leases/{lease_id}"))
        .header("x-auth-token", &alpha_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let mut gone = false;
    for _ in 0..300 {
        if nova.find_aggregate(&rid).await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "{}", server.logs());
    for id in host_ids.values() {
        let r = http
            .delete(format!("{base}/os-hosts/{id}"))
            .header("x-auth-token", &admin_token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    let logs = server.stop().await;
    assert!(logs.contains("Nova: a compute service changed"), "{logs}");
    assert!(logs.contains("reconciler repaired drift"), "{logs}");
}

/// Logs in as `user` in `project` (names; domain Default): the token and its body.
async fn login(env: &Env, user: &str, password: &str, project: &str) -> (String, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/auth/tokens?nocatalog", env.get("OS_AUTH_URL")))
        .json(&json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": user, "domain": {"name": "Default"}, "password": password}}},
            "scope": {"project": {"name": project, "domain": {"name": "Default"}}}}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let token = r.headers()["x-subject-token"].to_str().unwrap().to_string();
    (token, r.json().await.unwrap())
}

/// Acting for the user as Blazar does, the default of `--auth keystone`: the real binary
/// makes an instance reservation's server group through the member's trust (so the group is
/// the member's own, in their project), and deleting the lease removes group and trust.
#[tokio::test]
async fn the_binary_makes_the_users_server_group_through_their_trust() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let (server, base) = start_binary(
        &env,
        &dir,
        &["--monitor-interval", "0", "--reconcile-interval", "0"],
    )
    .await;
    let password = env.get("OS_SERVICE_PASSWORD");
    let auth_url = env.get("OS_AUTH_URL");
    let http = reqwest::Client::new();
    let (admin_token, _) = login(
        &env,
        &env.get("OS_USERNAME"),
        &env.get("OS_PASSWORD"),
        &env.get("OS_PROJECT_NAME"),
    )
    .await;
    let (member_token, member) =
        login(&env, "alpha-member", &env.get("OS_USER_PASSWORD"), "alpha").await;
    let member_id = member["token"]["user"]["id"].as_str().unwrap().to_string();
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    let (_, service) = login(
        &env,
        &env.get("OS_SERVICE_USERNAME"),
        &password,
        &env.get("OS_SERVICE_PROJECT_NAME"),
    )
    .await;
    let mut host_ids = Vec::new();
    for name in ["compute-1", "compute-2"] {
        let r = http
            .post(format!("{base}/os-hosts"))
            .header("x-auth-token", &admin_token)
            .json(&json!({ "name": name }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{}", server.logs());
        let host: Value = r.json().await.unwrap();
        host_ids.push(host["host"]["id"].as_str().unwrap().to_string());
    }

    let r = http
        .post(format!("{base}/leases"))
        .header("x-auth-token", &member_token)
        .json(&json!({"name": "trusted", "start_date": "2030-04-01 10:00",
            "end_date": "2030-04-01 12:00",
            "reservations": [{"resource_type": "virtual:instance", "amount": 2, "vcpus": 1,
                "memory_mb": 64, "disk_gb": 1, "affinity": false, "resource_properties": ""}],
            "events": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "{}", server.logs());
    let lease: Value = r.json().await.unwrap();
    let lease_id = lease["lease"]["id"].as_str().unwrap().to_string();
    let trust_id = lease["lease"]["trust_id"].as_str().unwrap().to_string();
    let group_id = lease["lease"]["reservations"][0]["server_group_id"]
        .as_str()
        .unwrap()
        .to_string();

    // The trust Blazar makes: the member's, to the service user, in alpha, impersonating.
    let trust_url = format!("{auth_url}/OS-TRUST/trusts/{trust_id}");
    let r = http
        .get(&trust_url)
        .header("x-auth-token", &admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let trust: Value = r.json().await.unwrap();
    assert_eq!(trust["trust"]["trustor_user_id"], member_id.as_str());
    assert_eq!(
        trust["trust"]["trustee_user_id"],
        service["token"]["user"]["id"]
    );
    assert_eq!(trust["trust"]["project_id"], alpha.as_str());
    assert_eq!(trust["trust"]["impersonation"], true);
    // The group was made through it: Nova records the member as its user, not the service
    // user (who would be its user had it acted with its own credentials in alpha).
    let group = compute(
        &admin,
        Method::GET,
        &format!("/os-server-groups/{group_id}"),
        None,
    )
    .await;
    assert_eq!(
        group["server_group"]["project_id"],
        alpha.as_str(),
        "{group}"
    );
    assert_eq!(
        group["server_group"]["user_id"],
        member_id.as_str(),
        "{group}"
    );
    assert_eq!(group["server_group"]["policies"], json!(["anti-affinity"]));

    // Deleting the lease removes the group, then the trust.
    let r = http
        .delete(format!("{base}/leases/{lease_id}"))
        .header("x-auth-token", &member_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let mut gone = false;
    for _ in 0..300 {
        let trust = http
            .get(&trust_url)
            .header("x-auth-token", &admin_token)
            .send()
            .await
            .unwrap()
            .status();
        let groups = compute(
            &admin,
            Method::GET,
            "/os-server-groups?all_projects=true",
            None,
        )
        .await;
        let group_left = groups["server_groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["id"] == group_id.as_str());
        if trust == StatusCode::NOT_FOUND && !group_left {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "{}", server.logs());
    for id in &host_ids {
        let r = http
            .delete(format!("{base}/os-hosts/{id}"))
            .header("x-auth-token", &admin_token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT, "{}", server.logs());
    }
    let logs = server.stop().await;
    assert!(logs.contains("trust made for a new lease"), "{logs}");
    assert!(logs.contains("trust deleted"), "{logs}");
    assert!(
        !logs.contains(&member_token),
        "a user's token is in the logs"
    );
}

async fn neutron(cloud: &Cloud, method: Method, path: &str, body: Option<Value>) -> Value {
    cloud
        .session
        .call(
            "network",
            method,
            path,
            Call {
                body,
                ..Call::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .body
}

async fn lease_status(app: &TestApp, lease_id: &str) -> (String, Value) {
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    let actions = app
        .get(&format!("/v1/leases/{lease_id}/actions"))
        .await
        .body;
    (
        lease["lease"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        actions,
    )
}

#[tokio::test]
async fn floating_ips_and_network_segments_exist_in_neutron_while_reserved() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    let public = neutron(&admin, Method::GET, "/v2.0/networks?name=public", None).await["networks"]
        [0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let subnet = neutron(
        &admin,
        Method::GET,
        &format!("/v2.0/subnets?network_id={public}"),
        None,
    )
    .await["subnets"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Registration checks the address against the network, with Blazar's answers.
    let register = |address: &str, network: &str| json!({"floating_network_id": network, "floating_ip_address": address});
    let r = app
        .post("/v1/floatingips", register("172.24.4.50", &public))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(
        r.message(),
        format!(
            "The floating IP 172.24.4.50 is used in allocation_pools or gateway_ip in subnet \
             {subnet} ."
        )
    );
    let r = app
        .post("/v1/floatingips", register("172.24.4.1", &public))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "the gateway: {}", r.body);
    let r = app
        .post("/v1/floatingips", register("10.9.9.9", &public))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    assert_eq!(
        r.message(),
        "Valid subnet for the floating IP 10.9.9.9 is not found."
    );
    let missing = "6a0c4c2e-0000-4000-8000-000000000000";
    let r = app
        .post("/v1/floatingips", register("172.24.4.230", missing))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.message(), format!("Failed to find network {missing}"));
    let r = app
        .post("/v1/floatingips", register("172.24.4.230", &public))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["floatingip"]["subnet_id"], json!(subnet));
    // A VLAN segment of the cloud's physical network.
    let r = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 150}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "neutron", "start_date": "2030-03-01 10:00",
                "end_date": "2030-03-01 12:00",
                "reservations": [
                    {"resource_type": "virtual:floatingip", "network_id": public, "amount": 1,
                     "required_floatingips": ["172.24.4.230"]},
                    {"resource_type": "network", "network_name": "alpha-net",
                     "network_description": "reserved segment", "resource_properties": ""}],
                "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let fip_rid = r.body["lease"]["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["resource_type"] == "virtual:floatingip")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.act_as_admin();
    let fips = |body: Value| body["floatingips"].as_array().cloned().unwrap_or_default();
    let at = "/v2.0/floatingips?floating_ip_address=172.24.4.230";
    assert!(fips(neutron(&admin, Method::GET, at, None).await).is_empty());

    // Start: the address is a floating IP of alpha's, tagged; the segment a network of
    // alpha's with its VLAN id.
    app.tick_at(t(2030, 3, 1, 10, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    let made = fips(neutron(&admin, Method::GET, at, None).await);
    assert_eq!(made.len(), 1);
    assert_eq!(made[0]["project_id"], json!(alpha));
    let tags: BTreeSet<String> = made[0]["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        tags,
        BTreeSet::from(["blazar".to_string(), format!("reservation:{fip_rid}")])
    );
    // Alpha sees it as its own.
    let alpha_cloud = env.member("alpha");
    assert_eq!(
        fips(neutron(&alpha_cloud, Method::GET, at, None).await).len(),
        1
    );
    // And can associate it: a port of alpha's behind a router on the external network.
    let private = neutron(
        &alpha_cloud,
        Method::POST,
        "/v2.0/networks",
        Some(json!({"network": {"name": "alpha-private"}})),
    )
    .await["network"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let private_subnet = neutron(
        &alpha_cloud,
        Method::POST,
        "/v2.0/subnets",
        Some(json!({"subnet": {"network_id": private, "ip_version": 4,
            "cidr": "10.77.0.0/24"}})),
    )
    .await["subnet"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let router = neutron(
        &alpha_cloud,
        Method::POST,
        "/v2.0/routers",
        Some(json!({"router": {"name": "alpha-router",
            "external_gateway_info": {"network_id": public}}})),
    )
    .await["router"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    neutron(
        &alpha_cloud,
        Method::PUT,
        &format!("/v2.0/routers/{router}/add_router_interface"),
        Some(json!({"subnet_id": private_subnet})),
    )
    .await;
    let port = neutron(
        &alpha_cloud,
        Method::POST,
        "/v2.0/ports",
        Some(json!({"port": {"network_id": private, "name": "alpha-vm-port"}})),
    )
    .await["port"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let fip_id = made[0]["id"].as_str().unwrap().to_string();
    let associated = neutron(
        &alpha_cloud,
        Method::PUT,
        &format!("/v2.0/floatingips/{fip_id}"),
        Some(json!({"floatingip": {"port_id": port}})),
    )
    .await;
    assert_eq!(
        associated["floatingip"]["port_id"],
        json!(port),
        "{associated}"
    );
    let nets = neutron(
        &alpha_cloud,
        Method::GET,
        "/v2.0/networks?name=alpha-net",
        None,
    )
    .await["networks"]
        .as_array()
        .cloned()
        .unwrap();
    assert_eq!(nets.len(), 1, "alpha does not see its network");
    let net_id = nets[0]["id"].as_str().unwrap().to_string();
    let seen = neutron(
        &admin,
        Method::GET,
        &format!("/v2.0/networks/{net_id}"),
        None,
    )
    .await;
    assert_eq!(seen["network"]["provider:segmentation_id"], 150);
    assert_eq!(seen["network"]["provider:network_type"], "vlan");
    assert_eq!(seen["network"]["provider:physical_network"], "physnet1");
    assert_eq!(seen["network"]["project_id"], json!(alpha));
    assert_eq!(seen["network"]["description"], "reserved segment");
    // Alpha puts a subnet and a port on it: they go with the network at the end.
    neutron(
        &alpha_cloud,
        Method::POST,
        "/v2.0/subnets",
        Some(json!({"subnet": {"network_id": net_id, "ip_version": 4,
            "cidr": "10.150.0.0/24"}})),
    )
    .await;
    neutron(
        &alpha_cloud,
        Method::POST,
        "/v2.0/ports",
        Some(json!({"port": {"network_id": net_id, "name": "left-behind"}})),
    )
    .await;
    // Alpha strips the network of its tags and renames it: still the reservation's network,
    // taken back at the end.
    neutron(
        &alpha_cloud,
        Method::DELETE,
        &format!("/v2.0/networks/{net_id}/tags"),
        None,
    )
    .await;
    neutron(
        &alpha_cloud,
        Method::PUT,
        &format!("/v2.0/networks/{net_id}"),
        Some(json!({"network": {"name": "renamed-by-alpha"}})),
    )
    .await;

    // End: both are gone.
    app.tick_at(t(2030, 3, 1, 12, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "TERMINATED", "{actions}");
    assert!(fips(neutron(&admin, Method::GET, at, None).await).is_empty());
    let after = neutron(
        &admin,
        Method::GET,
        "/v2.0/networks?provider%3Asegmentation_id=150",
        None,
    )
    .await;
    assert!(after["networks"].as_array().unwrap().is_empty(), "{after}");
    // Alpha's own network, router and port stay; the test removes them.
    neutron(
        &alpha_cloud,
        Method::PUT,
        &format!("/v2.0/routers/{router}/remove_router_interface"),
        Some(json!({"subnet_id": private_subnet})),
    )
    .await;
    neutron(
        &alpha_cloud,
        Method::DELETE,
        &format!("/v2.0/routers/{router}"),
        None,
    )
    .await;
    neutron(
        &alpha_cloud,
        Method::DELETE,
        &format!("/v2.0/ports/{port}"),
        None,
    )
    .await;
    neutron(
        &alpha_cloud,
        Method::DELETE,
        &format!("/v2.0/networks/{private}"),
        None,
    )
    .await;
}

/// Another project takes a reserved address in Neutron mid-lease (the lease's floating IP
/// deleted, the address made again as the admin project's): the monitor takes the address
/// out of service and the running reservation gets the other one, made in Neutron for alpha;
/// the foreign floating IP is left alone, and the address comes back once it is released.
#[tokio::test]
async fn a_reserved_address_another_project_takes_is_healed_around() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    let public = neutron(&admin, Method::GET, "/v2.0/networks?name=public", None).await["networks"]
        [0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    for address in ["172.24.4.231", "172.24.4.232"] {
        let r = app
            .post(
                "/v1/floatingips",
                json!({"floating_network_id": public, "floating_ip_address": address}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "taken", "start_date": "2030-03-01 10:00",
                "end_date": "2030-03-01 12:00",
                "reservations": [{"resource_type": "virtual:floatingip", "network_id": public,
                                  "amount": 1}],
                "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let (lease_id, rid) = lease_ids(&r);
    app.act_as_admin();
    app.tick_at(t(2030, 3, 1, 10, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    let tagged = format!("/v2.0/floatingips?tags=reservation%3A{rid}");
    let held = |body: Value| -> Vec<(String, String, String)> {
        body["floatingips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["floating_ip_address"].as_str().unwrap().to_string(),
                    f["project_id"].as_str().unwrap().to_string(),
                    f["id"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let first = held(neutron(&admin, Method::GET, &tagged, None).await);
    assert_eq!(first.len(), 1, "{first:?}");
    let (lost, _, fip_id) = first[0].clone();
    let other = if lost == "172.24.4.231" {
        "172.24.4.232"
    } else {
        "172.24.4.231"
    };
    assert_eq!(
        app.service.monitor_pools().await.unwrap(),
        blazar_service::MonitorReport::default()
    );

    // The admin project takes the address.
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/floatingips/{fip_id}"),
        None,
    )
    .await;
    let foreign = neutron(
        &admin,
        Method::POST,
        "/v2.0/floatingips",
        Some(json!({"floatingip": {"floating_network_id": public, "floating_ip_address": lost}})),
    )
    .await["floatingip"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.taken, vec![lost.clone()]);
    app.run_actions().await;
    let now_held = held(neutron(&admin, Method::GET, &tagged, None).await);
    assert_eq!(now_held.len(), 1, "{now_held:?}");
    assert_eq!(
        (now_held[0].0.as_str(), now_held[0].1.as_str()),
        (other, alpha.as_str())
    );
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body["lease"].clone();
    assert_eq!(lease["status"], "ACTIVE", "{lease}");
    assert_eq!(lease["degraded"], json!(false), "{lease}");
    // The foreign floating IP is not blazar-rs's to touch, and the reconciler has nothing
    // left to repair for the lease.
    let found = neutron(
        &admin,
        Method::GET,
        &format!("/v2.0/floatingips/{foreign}"),
        None,
    )
    .await;
    assert_eq!(found["floatingip"]["floating_ip_address"], json!(lost));
    let pass = app.service.reconcile(true).await.unwrap();
    assert!(
        pass.failed.iter().all(|line| !line.contains(&lost)),
        "{pass:?}"
    );

    // Released: the address is reservable again.
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/floatingips/{foreign}"),
        None,
    )
    .await;
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.freed, vec![lost.clone()]);

    // End: alpha's floating IP is gone.
    app.tick_at(t(2030, 3, 1, 12, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "TERMINATED", "{actions}");
    assert!(held(neutron(&admin, Method::GET, &tagged, None).await).is_empty());

    // A later lease whose start finds both addresses taken (before any monitor pass): it
    // starts, degraded, and gets its address once one is let go.
    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "later", "start_date": "2030-03-01 13:00",
                "end_date": "2030-03-01 14:00",
                "reservations": [{"resource_type": "virtual:floatingip", "network_id": public,
                                  "amount": 1}],
                "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let later = r.body["lease"]["id"].as_str().unwrap().to_string();
    let later_rid = r.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.act_as_admin();
    let mut foreign = Vec::new();
    for address in ["172.24.4.231", "172.24.4.232"] {
        foreign.push(
            neutron(
                &admin,
                Method::POST,
                "/v2.0/floatingips",
                Some(json!({"floatingip": {"floating_network_id": public,
                    "floating_ip_address": address}})),
            )
            .await["floatingip"]["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    app.tick_at(t(2030, 3, 1, 13, 0)).await;
    app.run_actions().await;
    let lease = app.get(&format!("/v1/leases/{later}")).await.body["lease"].clone();
    assert_eq!(lease["status"], "ACTIVE", "{lease}");
    assert_eq!(lease["degraded"], json!(true), "{lease}");
    let later_tagged = format!("/v2.0/floatingips?tags=reservation%3A{later_rid}");
    assert!(held(neutron(&admin, Method::GET, &later_tagged, None).await).is_empty());
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/floatingips/{}", foreign[1]),
        None,
    )
    .await;
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.freed, vec!["172.24.4.232".to_string()]);
    app.run_actions().await;
    let lease = app.get(&format!("/v1/leases/{later}")).await.body["lease"].clone();
    assert_eq!(lease["degraded"], json!(false), "{lease}");
    let got = held(neutron(&admin, Method::GET, &later_tagged, None).await);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].0.as_str(), got[0].1.as_str()),
        ("172.24.4.232", alpha.as_str())
    );
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/floatingips/{}", foreign[0]),
        None,
    )
    .await;
    app.tick_at(t(2030, 3, 1, 14, 0)).await;
    let (status, actions) = lease_status(&app, &later).await;
    assert_eq!(status, "TERMINATED", "{actions}");
    assert!(held(neutron(&admin, Method::GET, &later_tagged, None).await).is_empty());
}

/// A reserved segment another project puts a network on mid-lease (the lease's network
/// deleted first): with no other segment free the lease is degraded; when that network goes
/// the segment comes back and the lease's network is made on it again.
#[tokio::test]
async fn a_reserved_segment_another_project_takes_degrades_the_lease_until_it_is_back() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    let r = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 161}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "segment", "start_date": "2030-03-01 10:00",
                "end_date": "2030-03-01 12:00",
                "reservations": [{"resource_type": "network", "network_name": "alpha-161",
                                  "resource_properties": ""}],
                "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    app.act_as_admin();
    app.tick_at(t(2030, 3, 1, 10, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    let on_segment = "/v2.0/networks?provider%3Asegmentation_id=161";
    let networks = |body: Value| -> Vec<(String, String)> {
        body["networks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["id"].as_str().unwrap().to_string(),
                    n["project_id"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let made = networks(neutron(&admin, Method::GET, on_segment, None).await);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].1, alpha);

    // The admin project takes the segment.
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/networks/{}", made[0].0),
        None,
    )
    .await;
    let foreign = neutron(
        &admin,
        Method::POST,
        "/v2.0/networks",
        Some(
            json!({"network": {"name": "not-blazars", "provider:network_type": "vlan",
            "provider:physical_network": "physnet1", "provider:segmentation_id": 161}}),
        ),
    )
    .await["network"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.taken, vec!["physnet1:161".to_string()]);
    app.run_actions().await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body["lease"].clone();
    assert_eq!(lease["degraded"], json!(true), "{lease}");
    // Not blazar-rs's to take away.
    let left = networks(neutron(&admin, Method::GET, on_segment, None).await);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].0, foreign);
    assert_ne!(left[0].1, alpha);

    // Released: the segment is the lease's again, its network made for alpha.
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/networks/{foreign}"),
        None,
    )
    .await;
    let report = app.service.monitor_pools().await.unwrap();
    assert_eq!(report.freed, vec!["physnet1:161".to_string()]);
    app.run_actions().await;
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body["lease"].clone();
    assert_eq!(lease["degraded"], json!(false), "{lease}");
    let made = networks(neutron(&admin, Method::GET, on_segment, None).await);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].1, alpha);

    app.tick_at(t(2030, 3, 1, 12, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "TERMINATED", "{actions}");
    assert!(networks(neutron(&admin, Method::GET, on_segment, None).await).is_empty());
}

#[tokio::test]
async fn instance_reservations_make_a_flavor_slots_and_a_group_for_the_project() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let (mut app, host_ids) = instance_app(&env).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    let r = ask_instance_lease(
        &mut app,
        &env,
        "instances",
        json!({"resource_type": "virtual:instance", "amount": 3, "vcpus": 1,
            "memory_mb": 64, "disk_gb": 1, "affinity": false, "resource_properties": ""}),
        t(2030, 4, 1, 10, 0),
    )
    .await;
    let (lease_id, rid) = lease_ids(&r);
    let class = format!(
        "CUSTOM_RESERVATION_{}",
        rid.to_uppercase().replace('-', "_")
    );

    // At reservation: the private flavor with Blazar's extra specs, the aggregate with its
    // metadata, the resource class, and alpha's anti-affinity group.
    let flavor = compute(&admin, Method::GET, &format!("/flavors/{rid}"), None).await;
    assert_eq!(flavor["flavor"]["name"], format!("reservation:{rid}"));
    assert_eq!(flavor["flavor"]["os-flavor-access:is_public"], false);
    assert_eq!(flavor["flavor"]["vcpus"], 1);
    assert_eq!(flavor["flavor"]["ram"], 64);
    let specs = compute(
        &admin,
        Method::GET,
        &format!("/flavors/{rid}/os-extra_specs"),
        None,
    )
    .await["extra_specs"]
        .clone();
    assert_eq!(
        specs["aggregate_instance_extra_specs:reservation"],
        json!(rid)
    );
    assert_eq!(specs[format!("resources:{class}")], "1");
    let aggregate = nova.find_aggregate(&rid).await.unwrap().expect("aggregate");
    assert_eq!(aggregate.metadata["reservation"], json!(rid));
    assert_eq!(aggregate.metadata["filter_tenant_id"], json!(alpha));
    assert_eq!(aggregate.metadata["blazar:owner"], json!(alpha));
    assert!(aggregate.availability_zone.is_none());
    let alpha_cloud = env.member("alpha");
    let beta_cloud = env.member("beta");
    let groups = compute(&alpha_cloud, Method::GET, "/os-server-groups", None).await;
    let group = groups["server_groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == format!("reservation:{rid}"))
        .cloned()
        .expect("alpha's server group");
    assert_eq!(group["policies"], json!(["anti-affinity"]));
    assert_eq!(specs["affinity_id"], group["id"]);
    // The create answered with the ids Nova gave the group (users pass it as a hint) and
    // the aggregate.
    assert_eq!(
        r.body["lease"]["reservations"][0]["server_group_id"], group["id"],
        "{}",
        r.body
    );
    assert_eq!(
        r.body["lease"]["reservations"][0]["aggregate_id"],
        json!(aggregate.id),
        "{}",
        r.body
    );

    // Start: alpha may use the flavor, each host has one slot of the class.
    app.tick_at(t(2030, 4, 1, 10, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    assert!(
        sees_flavor(&alpha_cloud, &rid).await,
        "alpha does not see its flavor"
    );
    assert!(
        !sees_flavor(&beta_cloud, &rid).await,
        "beta sees alpha's flavor"
    );
    let slots = class_slots(&admin, &class).await;
    assert!(slots.iter().all(|(_, n)| *n == 1), "{slots:?}");
    // Its aggregate deleted by hand: the reconciler makes it again, with its hosts, and the
    // reservation shows the new one's id.
    let aggregate = nova.find_aggregate(&rid).await.unwrap().expect("aggregate");
    for host in &aggregate.hosts {
        nova.remove_host(&aggregate, host).await.unwrap();
    }
    nova.delete_aggregate(&aggregate).await.unwrap();
    let report = reconcile_report(&app, false).await;
    assert_eq!(report["failed"], json!([]), "{report}");
    let remade = nova
        .find_aggregate(&rid)
        .await
        .unwrap()
        .expect("aggregate made again");
    assert_ne!(remade.id, aggregate.id);
    assert_eq!(remade.hosts.len(), 3, "{remade:?}");
    let shown = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    assert_eq!(
        shown["lease"]["reservations"][0]["aggregate_id"],
        json!(remade.id),
        "{shown}"
    );
    // Alpha boots three servers with it: one per host; a fourth finds no slot.
    let mut servers = Vec::new();
    let mut hosts = BTreeSet::new();
    for i in 0..3 {
        let (id, status) = boot_flavor(&alpha_cloud, &format!("slot-{i}"), &rid).await;
        assert_eq!(status, "ACTIVE", "server {i} of the reservation");
        hosts.insert(server_host(&admin, &id).await);
        servers.push(id);
    }
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    let (_, status) = boot_flavor(&alpha_cloud, "slot-4", &rid).await;
    assert_eq!(status, "ERROR", "a fourth server found a slot");
    // The flavor deleted by hand: Nova no longer finds the servers by it, Placement still
    // knows what they hold.
    compute(&admin, Method::DELETE, &format!("/flavors/{rid}"), None).await;

    // End: servers, flavor, group, aggregate, inventories and class are gone.
    app.tick_at(t(2030, 4, 1, 12, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "TERMINATED", "{actions}");
    assert_servers_gone(&admin, &servers).await;
    assert!(nova.flavor(&rid).await.unwrap().is_none());
    assert!(nova.find_aggregate(&rid).await.unwrap().is_none());
    let groups = compute(&alpha_cloud, Method::GET, "/os-server-groups", None).await;
    assert!(
        groups["server_groups"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["name"] != format!("reservation:{rid}"))
    );
    let classes = admin
        .session
        .call(
            "placement",
            Method::GET,
            &format!("/resource_classes/{class}"),
            Call {
                headers: vec![("openstack-api-version", "placement 1.29".into())],
                ..Call::default()
            },
        )
        .await;
    assert!(
        matches!(&classes, Err(e) if e.is_not_found()),
        "{classes:?}"
    );
    // Any server still in ERROR goes before the hosts are removed.
    reset_cloud(&admin).await;
    withdraw(&app, &admin, &host_ids).await;
}

/// None of `servers` is left in the cloud.
async fn assert_servers_gone(admin: &Cloud, servers: &[String]) {
    let left = compute(admin, Method::GET, "/servers?all_tenants=1", None).await;
    for id in servers {
        assert!(
            left["servers"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["id"] != json!(id)),
            "server {id} outlived the reservation: {left}"
        );
    }
}

async fn sees_flavor(cloud: &Cloud, id: &str) -> bool {
    let listed = compute(cloud, Method::GET, "/flavors", None).await;
    listed["flavors"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["id"] == json!(id))
}

/// Boots a server with flavor `flavor` (no hint: instance reservations are found by their
/// flavor) and waits until it is ACTIVE or ERROR.
async fn boot_flavor(cloud: &Cloud, name: &str, flavor: &str) -> (String, String) {
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
    let body = json!({"server": {"name": name, "imageRef": image, "flavorRef": flavor,
        "networks": "none"}});
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

/// A Placement call as the admin, at the microversion blazar-rs speaks.
async fn placement_call(admin: &Cloud, method: Method, path: &str, body: Option<Value>) -> Value {
    admin
        .session
        .call(
            "placement",
            method,
            path,
            Call {
                body,
                headers: vec![("openstack-api-version", "placement 1.29".into())],
                request_id: None,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .body
}

/// Gives (or takes away) a trait on a compute node's provider, as an operator would with
/// `openstack resource provider trait set`.
async fn set_node_trait(admin: &Cloud, host: &str, name: &str, present: bool) {
    edit_provider_set(admin, host, "traits", name, present).await;
}

/// Adds `item` to (or takes it from) compute node `node`'s provider's `what` (`traits` or
/// `aggregates`: sets Placement replaces whole, guarded by the provider's generation).
async fn edit_provider_set(admin: &Cloud, node: &str, what: &str, item: &str, present: bool) {
    let provider = admin
        .placement(None)
        .provider_by_name(node)
        .await
        .unwrap()
        .unwrap();
    let path = format!("/resource_providers/{}/{what}", provider.uuid);
    let current = placement_call(admin, Method::GET, &path, None).await;
    let mut items: BTreeSet<String> = current[what]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    if present {
        items.insert(item.to_string());
    } else {
        items.remove(item);
    }
    placement_call(
        admin,
        Method::PUT,
        &path,
        Some(json!({what: items,
            "resource_provider_generation": current["resource_provider_generation"]})),
    )
    .await;
}

/// flavor:instance: the source flavor is Nova's, seen as the caller sees it, and its
/// `trait:` requirement is answered by Placement as it is now (the trait is set after the
/// hosts were enrolled).
#[tokio::test]
async fn flavor_instance_reservations_read_nova_and_place_by_placement_traits() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let backend = OpenStackBackend::new(
        env.service(),
        OpenStackSettings {
            server_delete_timeout: Duration::from_secs(60),
            ..OpenStackSettings::default()
        },
    );
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let host_ids = enrol(&app, &["compute-1", "compute-2", "compute-3"]).await;
    let fast = "CUSTOM_BLAZAR_FAST";
    placement_call(&admin, Method::PUT, &format!("/traits/{fast}"), None).await;
    set_node_trait(&admin, "compute-2", fast, true).await;
    // A private flavor requiring the trait, not yet shared with alpha.
    let source = "blazar-fast";
    if nova.flavor(source).await.unwrap().is_some() {
        nova.delete_flavor(source).await.unwrap();
    }
    compute(
        &admin,
        Method::POST,
        "/flavors",
        Some(
            json!({"flavor": {"id": source, "name": "fast", "vcpus": 1, "ram": 64,
            "disk": 1, "os-flavor-access:is_public": false}}),
        ),
    )
    .await;
    compute(
        &admin,
        Method::POST,
        &format!("/flavors/{source}/os-extra_specs"),
        Some(json!({"extra_specs": {format!("trait:{fast}"): "required"}})),
    )
    .await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    let lease = |flavor: &str| {
        json!({"name": "by-flavor", "start_date": "2030-05-01 10:00",
            "end_date": "2030-05-01 12:00",
            "reservations": [{"resource_type": "flavor:instance", "flavor_id": flavor,
                "amount": 2, "affinity": "None"}],
            "events": []})
    };
    app.act_as(&alpha, "alpha-user", "member");
    // Alpha cannot see the flavor yet: 404, as Nova answers alpha; nor one that is nowhere.
    let r = app.post("/v1/leases", lease(source)).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    let r = app.post("/v1/leases", lease("no-such-flavor")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    app.act_as_admin();
    nova.add_flavor_access(source, &alpha).await.unwrap();
    app.act_as(&alpha, "alpha-user", "member");
    // Now seen; by name too.
    let r = app.post("/v1/leases", lease("fast")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease_id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let reservation = r.body["lease"]["reservations"][0].clone();
    let rid = reservation["id"].as_str().unwrap().to_string();
    let kept: Value =
        serde_json::from_str(reservation["resource_properties"].as_str().unwrap()).unwrap();
    assert_eq!(kept["id"], source);
    assert_eq!(kept["extra_specs"][format!("trait:{fast}")], "required");
    assert_eq!(reservation["vcpus"], 1);
    assert_eq!(reservation["memory_mb"], 64);
    app.act_as_admin();
    // Both slots are on the only host with the trait.
    let granted = granted_hosts(&app, &lease_id).await;
    assert!(!granted.is_empty());
    assert!(granted.iter().all(|h| h == &host_ids[1]), "{granted:?}");
    // A trait Placement does not know is refused as malformed.
    compute(
        &admin,
        Method::POST,
        &format!("/flavors/{source}/os-extra_specs"),
        Some(json!({"extra_specs": {"trait:CUSTOM_NOWHERE_AT_ALL": "required"}})),
    )
    .await;
    app.act_as(&alpha, "alpha-user", "member");
    let r = app.post("/v1/leases", lease(source)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    app.act_as_admin();
    wait_idle(&app).await;

    // Start: the reservation flavor carries the source's specs with Blazar's; a server
    // booted with it lands on the host with the trait.
    app.tick_at(t(2030, 5, 1, 10, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    let specs = compute(
        &admin,
        Method::GET,
        &format!("/flavors/{rid}/os-extra_specs"),
        None,
    )
    .await["extra_specs"]
        .clone();
    assert_eq!(specs[format!("trait:{fast}")], "required");
    assert_eq!(
        specs["aggregate_instance_extra_specs:reservation"],
        json!(rid)
    );
    let alpha_cloud = env.member("alpha");
    let (server, status) = boot_flavor(&alpha_cloud, "fast-0", &rid).await;
    assert_eq!(status, "ACTIVE");
    assert_eq!(server_host(&admin, &server).await, "compute-2");

    // End: the reservation's flavor and server are gone; the source flavor stays.
    app.tick_at(t(2030, 5, 1, 12, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "TERMINATED", "{actions}");
    assert!(nova.flavor(&rid).await.unwrap().is_none());
    assert!(nova.flavor(source).await.unwrap().is_some());
    nova.delete_flavor(source).await.unwrap();
    set_node_trait(&admin, "compute-2", fast, false).await;
    reset_cloud(&admin).await;
    withdraw(&app, &admin, &host_ids).await;
}

/// An app acting on the cloud (a lease's end waits at most a minute for its servers) with
/// the three computes enrolled: the app and the hosts' ids.
async fn instance_app(env: &Env) -> (TestApp, Vec<String>) {
    let backend = OpenStackBackend::new(
        env.service(),
        OpenStackSettings {
            server_delete_timeout: Duration::from_secs(60),
            ..OpenStackSettings::default()
        },
    );
    let app = TestApp::spawn_backend(Arc::new(backend)).await;
    let host_ids = enrol(&app, &["compute-1", "compute-2", "compute-3"]).await;
    (app, host_ids)
}

/// A lease of `reservation` that alpha asks for, from `start` for two hours: the create's
/// answer, once what is made at reservation time is made (the app acts as admin again).
async fn ask_instance_lease(
    app: &mut TestApp,
    env: &Env,
    name: &str,
    reservation: Value,
    start: chrono::DateTime<chrono::Utc>,
) -> blazar_testkit::Response {
    app.act_as(&env.get("OS_ALPHA_PROJECT_ID"), "alpha-user", "member");
    let wire = |at: chrono::DateTime<chrono::Utc>| at.format("%Y-%m-%d %H:%M").to_string();
    let r = app
        .post(
            "/v1/leases",
            json!({"name": name, "start_date": wire(start),
                "end_date": wire(start + chrono::Duration::hours(2)),
                "reservations": [reservation], "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as_admin();
    wait_idle(app).await;
    r
}

/// The lease `ask_instance_lease` asks for, started: (lease id, reservation id, the
/// reservation's resource class).
async fn start_instance_lease(
    app: &mut TestApp,
    env: &Env,
    name: &str,
    reservation: Value,
    start: chrono::DateTime<chrono::Utc>,
) -> (String, String, String) {
    let r = ask_instance_lease(app, env, name, reservation, start).await;
    let (lease_id, rid) = lease_ids(&r);
    let class = format!(
        "CUSTOM_RESERVATION_{}",
        rid.to_uppercase().replace('-', "_")
    );
    app.tick_at(start).await;
    let (status, actions) = lease_status(app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    (lease_id, rid, class)
}

/// Slots of reservation class `class` on each host's `blazar_<host>` provider (0: none).
async fn class_slots(admin: &Cloud, class: &str) -> Vec<(String, i64)> {
    let placement = admin.placement(None);
    let mut out = Vec::new();
    for host in ["compute-1", "compute-2", "compute-3"] {
        let provider = placement
            .provider_by_name(&format!("blazar_{host}"))
            .await
            .unwrap()
            .unwrap();
        let total = placement
            .inventories(&provider.uuid)
            .await
            .unwrap()
            .into_iter()
            .find(|(c, ..)| c == class)
            .map_or(0, |(_, total, ..)| total);
        out.push((host.to_string(), total));
    }
    out
}

/// Ends the instance lease (lease id, reservation id, class) started by
/// `start_instance_lease` at `at`: it is TERMINATED, its aggregate and every slot of its
/// class gone.
async fn end_instance_lease(
    app: &TestApp,
    admin: &Cloud,
    (lease_id, rid, class): (&str, &str, &str),
    at: chrono::DateTime<chrono::Utc>,
) {
    app.tick_at(at).await;
    let (status, actions) = lease_status(app, lease_id).await;
    assert_eq!(status, "TERMINATED", "{actions}");
    assert!(
        admin
            .nova(None)
            .find_aggregate(rid)
            .await
            .unwrap()
            .is_none()
    );
    let slots = class_slots(admin, class).await;
    assert!(slots.iter().all(|(_, n)| *n == 0), "{slots:?}");
}

async fn reservation_flags(app: &TestApp, lease_id: &str) -> (bool, bool) {
    let lease = app.get(&format!("/v1/leases/{lease_id}")).await.body;
    let r = &lease["lease"]["reservations"][0];
    (
        r["missing_resources"].as_bool().unwrap(),
        r["resources_changed"].as_bool().unwrap(),
    )
}

/// A unit of an instance reservation's class that Placement says a server holds, where
/// Nova no longer has the server (deleted while Placement was down: Nova frees its
/// allocations only once Placement answers, at nova-compute's next periodic task, and until
/// then the class's inventory cannot go): the end frees it and finishes.
#[tokio::test]
async fn an_instance_end_frees_units_held_by_servers_nova_no_longer_has() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let (mut app, host_ids) = instance_app(&env).await;
    let (lease_id, rid, class) = start_instance_lease(
        &mut app,
        &env,
        "stale-units",
        json!({"resource_type": "virtual:instance", "amount": 2, "vcpus": 1,
            "memory_mb": 64, "disk_gb": 1, "affinity": true, "resource_properties": ""}),
        t(2030, 7, 1, 10, 0),
    )
    .await;
    let placement = admin.placement(None);
    // Affinity: both slots on one host.
    let (host, _) = class_slots(&admin, &class)
        .await
        .into_iter()
        .find(|(_, n)| *n == 2)
        .expect("a host with both slots");
    let provider = placement
        .provider_by_name(&format!("blazar_{host}"))
        .await
        .unwrap()
        .unwrap();
    let gone = "0f0e0d0c-0b0a-4909-8807-060504030201";
    let uuid = provider.uuid.clone();
    placement_call(
        &admin,
        Method::PUT,
        &format!("/allocations/{gone}"),
        Some(
            json!({"allocations": {uuid: {"resources": {class.clone(): 1}}},
            "project_id": env.get("OS_ALPHA_PROJECT_ID"),
            "user_id": "0f0e0d0c0b0a49098807060504030201",
            "consumer_generation": null}),
        ),
    )
    .await;
    // And one of a migration (a resize of a server off the reservation's flavor, not yet
    // confirmed): Nova does not show it as a server either, but it is not to be freed.
    let migration = "0f0e0d0c-0b0a-4909-8807-0605040302ff";
    let at = |path: String, method: Method, body: Option<Value>| {
        let admin = &admin;
        async move {
            admin
                .session
                .call(
                    "placement",
                    method,
                    &path,
                    Call {
                        body,
                        headers: vec![("openstack-api-version", "placement 1.38".into())],
                        request_id: None,
                    },
                )
                .await
                .unwrap()
                .body
        }
    };
    at(
        format!("/allocations/{migration}"),
        Method::PUT,
        Some(
            json!({"allocations": {provider.uuid.clone(): {"resources": {class.clone(): 1}}},
            "project_id": env.get("OS_ALPHA_PROJECT_ID"),
            "user_id": "0f0e0d0c0b0a49098807060504030201",
            "consumer_generation": null, "consumer_type": "MIGRATION"}),
        ),
    )
    .await;
    let mut holders = placement
        .consumers_of(&provider.uuid, &class)
        .await
        .unwrap();
    holders.sort();
    assert_eq!(holders, vec![gone.to_string(), migration.to_string()]);
    let end = t(2030, 7, 1, 12, 0);
    app.tick_at(end).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "TERMINATING", "{actions}");
    let held = placement_call(&admin, Method::GET, &format!("/allocations/{gone}"), None).await;
    assert_eq!(held["allocations"], json!({}), "{held}");
    let held = at(format!("/allocations/{migration}"), Method::GET, None).await;
    assert_eq!(held["consumer_type"], "MIGRATION", "{held}");
    // The resize confirmed (Nova frees the migration's units): the end finishes.
    at(format!("/allocations/{migration}"), Method::DELETE, None).await;
    app.clock.set(end + chrono::Duration::seconds(40));
    app.run_actions().await;
    end_instance_lease(&app, &admin, (&lease_id, &rid, &class), end).await;
    withdraw(&app, &admin, &host_ids).await;
}

/// An instance reservation in force whose host fails mid-lease, healed as Blazar's instance
/// plugin heals it: the failed host's slot moves to a free host, which joins the
/// reservation's aggregate with an inventory of its class; the failed host leaves the
/// aggregate, and its server runs on (its inventory stays while the server holds it). The
/// project boots on the moved slot; beyond it and the server that stays, on no slot.
#[tokio::test]
async fn a_failed_hosts_instance_slot_moves_mid_lease_and_its_server_stays() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let (mut app, host_ids) = instance_app(&env).await;
    let (lease_id, rid, class) = start_instance_lease(
        &mut app,
        &env,
        "healed-instances",
        json!({"resource_type": "virtual:instance", "amount": 2, "vcpus": 1,
            "memory_mb": 64, "disk_gb": 1, "affinity": false, "resource_properties": ""}),
        t(2030, 6, 1, 10, 0),
    )
    .await;
    let held: BTreeSet<String> = nova
        .find_aggregate(&rid)
        .await
        .unwrap()
        .unwrap()
        .hosts
        .into_iter()
        .collect();
    assert_eq!(held.len(), 2, "{held:?}");
    let spare = ["compute-1", "compute-2", "compute-3"]
        .into_iter()
        .find(|h| !held.contains(*h))
        .unwrap()
        .to_string();
    let alpha_cloud = env.member("alpha");
    let (first, status) = boot_flavor(&alpha_cloud, "slot-0", &rid).await;
    assert_eq!(status, "ACTIVE");
    let failing = server_host(&admin, &first).await;
    let other = held.iter().find(|h| **h != failing).unwrap().clone();

    // The compute service of the server's host fails.
    set_compute_enabled(&admin, &failing, false).await;
    let report = app.service.monitor_hosts().await.unwrap();
    assert_eq!(report.failed, vec![failing.clone()]);
    app.run_actions().await;
    wait_idle(&app).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    assert_actions_done(&actions);
    assert_eq!(
        reservation_flags(&app, &lease_id).await,
        (false, true),
        "(missing_resources, resources_changed)"
    );
    let now_held: BTreeSet<String> = nova
        .find_aggregate(&rid)
        .await
        .unwrap()
        .unwrap()
        .hosts
        .into_iter()
        .collect();
    assert_eq!(now_held, BTreeSet::from([other.clone(), spare.clone()]));
    // One slot on each host: the failed host's inventory stays while its server holds it.
    let slots = class_slots(&admin, &class).await;
    assert!(slots.iter().all(|(_, n)| *n == 1), "{slots:?}");
    let kept = compute(&admin, Method::GET, &format!("/servers/{first}"), None).await;
    assert_eq!(kept["server"]["status"], "ACTIVE", "{kept}");

    // The project boots on the slots it holds now, and only on them.
    let mut hosts = BTreeSet::new();
    let mut servers = vec![first.clone()];
    for i in 1..3 {
        let (id, status) = boot_flavor(&alpha_cloud, &format!("slot-{i}"), &rid).await;
        assert_eq!(status, "ACTIVE", "server {i} after healing");
        hosts.insert(server_host(&admin, &id).await);
        servers.push(id);
    }
    assert_eq!(hosts, BTreeSet::from([other.clone(), spare.clone()]));
    let (_, status) = boot_flavor(&alpha_cloud, "slot-3", &rid).await;
    assert_eq!(
        status, "ERROR",
        "a server beyond the reservation found a slot"
    );

    // The end takes every server, the failed host's with them, and every slot.
    set_compute_enabled(&admin, &failing, true).await;
    end_instance_lease(
        &app,
        &admin,
        (&lease_id, &rid, &class),
        t(2030, 6, 1, 12, 0),
    )
    .await;
    assert_servers_gone(&admin, &servers).await;
    reset_cloud(&admin).await;
    withdraw(&app, &admin, &host_ids).await;
}

/// A host's allocation ratio lowered mid-lease leaves it fewer instance slots than a
/// reservation in force holds there: only the slots over its capacity move, to another
/// host that joins the aggregate with an inventory for them; the host keeps the rest and
/// the servers on them.
#[tokio::test]
async fn a_lowered_ratio_moves_only_the_instance_slots_over_the_hosts_capacity() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let (mut app, host_ids) = instance_app(&env).await;
    let names = ["compute-1", "compute-2", "compute-3"];
    // Four slots fit on a host at the default ratio (1.0), two at 0.5. Sized by disk: Nova's
    // quotas cap cores and memory, not disk.
    let disk = app.get(&format!("/v1/os-hosts/{}", host_ids[0])).await.body["host"]["local_gb"]
        .as_i64()
        .unwrap();
    let slot = disk / 4;
    assert!(slot >= 1, "hosts of {disk} GB");
    let (lease_id, rid, class) = start_instance_lease(
        &mut app,
        &env,
        "packed",
        json!({"resource_type": "virtual:instance", "amount": 3, "vcpus": 1,
            "memory_mb": 64, "disk_gb": slot, "affinity": null, "resource_properties": ""}),
        t(2030, 7, 1, 10, 0),
    )
    .await;
    // Without an affinity rule the three slots share one host.
    let packed = nova.find_aggregate(&rid).await.unwrap().unwrap().hosts;
    assert_eq!(packed.len(), 1, "{packed:?}");
    let packed = packed[0].clone();
    let slots: Vec<(String, i64)> = class_slots(&admin, &class).await;
    for (host, n) in &slots {
        assert_eq!(*n, if *host == packed { 3 } else { 0 }, "{slots:?}");
    }
    let alpha_cloud = env.member("alpha");
    for i in 0..2 {
        let (id, status) = boot_flavor(&alpha_cloud, &format!("packed-{i}"), &rid).await;
        assert_eq!(status, "ACTIVE", "server {i}");
        assert_eq!(server_host(&admin, &id).await, packed);
    }

    // The operator halves the host's disk ratio: room for two slots of the three.
    let packed_id = &host_ids[names.iter().position(|n| *n == packed).unwrap()];
    let r = app
        .put(
            &format!("/v1/os-hosts/{packed_id}"),
            json!({"disk_allocation_ratio": "0.5"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    app.run_actions().await;
    wait_idle(&app).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    assert_actions_done(&actions);
    assert_eq!(
        reservation_flags(&app, &lease_id).await,
        (false, true),
        "(missing_resources, resources_changed)"
    );
    let held = nova.find_aggregate(&rid).await.unwrap().unwrap().hosts;
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.contains(&packed), "{held:?}");
    let moved_to = held.iter().find(|h| **h != packed).unwrap().clone();
    let slots = class_slots(&admin, &class).await;
    for (host, n) in &slots {
        let expected = if *host == packed {
            2
        } else if *host == moved_to {
            1
        } else {
            0
        };
        assert_eq!(*n, expected, "{slots:?}");
    }
    // The third server lands on the moved slot; a fourth finds none.
    let (id, status) = boot_flavor(&alpha_cloud, "packed-2", &rid).await;
    assert_eq!(status, "ACTIVE", "the moved slot");
    assert_eq!(server_host(&admin, &id).await, moved_to);
    let (_, status) = boot_flavor(&alpha_cloud, "packed-3", &rid).await;
    assert_eq!(
        status, "ERROR",
        "a server beyond the reservation found a slot"
    );

    end_instance_lease(
        &app,
        &admin,
        (&lease_id, &rid, &class),
        t(2030, 7, 1, 12, 0),
    )
    .await;
    reset_cloud(&admin).await;
    withdraw(&app, &admin, &host_ids).await;
}

/// The reconciler beyond aggregates: the pieces of an instance, floating-IP and network
/// reservation in force that were broken by hand are made again, and what the cloud holds
/// for reservations the database had and does not keep is removed (for ones it never had,
/// listed and left).
#[tokio::test]
async fn the_reconciler_repairs_instance_and_neutron_reservations() {
    let Some(env) = env() else { return };
    let _one_at_a_time = CLOUD.lock().await;
    let admin = env.admin();
    reset_cloud(&admin).await;
    let nova = admin.nova(None);
    let placement = admin.placement(None);
    let backend = OpenStackBackend::new(env.service(), OpenStackSettings::default());
    let mut app = TestApp::spawn_backend(Arc::new(backend)).await;
    let host_ids = enrol(&app, &["compute-1", "compute-2", "compute-3"]).await;
    let alpha = env.get("OS_ALPHA_PROJECT_ID");
    let public = neutron(&admin, Method::GET, "/v2.0/networks?name=public", None).await["networks"]
        [0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let address = "172.24.4.231";
    let r = app
        .post(
            "/v1/floatingips",
            json!({"floating_network_id": public, "floating_ip_address": address}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": 151}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app.act_as(&alpha, "alpha-user", "member");
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "drift", "start_date": "2030-06-01 10:00",
                "end_date": "2030-06-01 12:00",
                "reservations": [
                    {"resource_type": "virtual:instance", "amount": 2, "vcpus": 1,
                     "memory_mb": 64, "disk_gb": 1, "affinity": false,
                     "resource_properties": ""},
                    {"resource_type": "virtual:floatingip", "network_id": public, "amount": 1,
                     "required_floatingips": [address]},
                    {"resource_type": "network", "network_name": "drift-net",
                     "resource_properties": ""}],
                "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let (lease_id, rid) = lease_ids(&r);
    app.act_as_admin();
    app.tick_at(t(2030, 6, 1, 10, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "ACTIVE", "{actions}");
    // A lease of an instance reservation made and deleted: its reservation is one this
    // database had (an orphan of its is made again by hand below).
    let r = ask_instance_lease(
        &mut app,
        &env,
        "gone",
        json!({"resource_type": "virtual:instance", "amount": 1, "vcpus": 1,
            "memory_mb": 64, "disk_gb": 1, "affinity": null, "resource_properties": ""}),
        t(2030, 9, 1, 10, 0),
    )
    .await;
    let (gone_lease, known) = lease_ids(&r);
    let deleted = app.delete(&format!("/v1/leases/{gone_lease}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    wait_idle(&app).await;
    assert!(nova.flavor(&known).await.unwrap().is_none());
    let reconcile = |dry_run: bool| reconcile_repairs(&app, dry_run);
    assert_eq!(
        reconcile(true).await,
        Vec::<String>::new(),
        "drift before any"
    );

    // Break it by hand: alpha loses the flavor, the aggregate admits another project, a
    // host loses its slots, the floating IP and the network are deleted.
    nova.remove_flavor_access(&rid, &alpha).await.unwrap();
    let group_of = |lease: &Value| {
        lease["lease"]["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource_type"] == "virtual:instance")
            .unwrap()["server_group_id"]
            .as_str()
            .unwrap()
            .to_string()
    };

    let intruder = "0badc0de0badc0de0badc0de0badc0de";
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    let mut metadata = serde_json::Map::new();
    metadata.insert(intruder.into(), json!("true"));
    nova.set_metadata(&aggregate, metadata).await.unwrap();
    // A zone named like a host reservation's: the aggregate is still the instance
    // reservation's, not a host reservation's leftover to remove.
    nova.set_zone(&aggregate, "blazar_by_hand").await.unwrap();
    // A host holding none of its slots put into its aggregate: its servers would pass as
    // the reservation's.
    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    let granted_hosts = aggregate.hosts.clone();
    let stray_host = ["compute-1", "compute-2", "compute-3"]
        .into_iter()
        .find(|h| !granted_hosts.iter().any(|g| g == h))
        .expect("a host without slots");
    nova.add_host(&aggregate, stray_host).await.unwrap();
    let class = format!(
        "CUSTOM_RESERVATION_{}",
        rid.to_uppercase().replace('-', "_")
    );
    // Another project is let use the flavor.
    let beta = env.get("OS_BETA_PROJECT_ID");
    nova.add_flavor_access(&rid, &beta).await.unwrap();
    // The flavor loses the key that holds its servers to the reservation's slots and
    // gains one nobody granted.
    compute(
        &admin,
        Method::DELETE,
        &format!("/flavors/{rid}/os-extra_specs/resources%3A{class}"),
        None,
    )
    .await;
    compute(
        &admin,
        Method::POST,
        &format!("/flavors/{rid}/os-extra_specs"),
        Some(json!({"extra_specs": {"blazar-test:stray": "x"}})),
    )
    .await;
    let mut emptied = None;
    for host in ["compute-1", "compute-2", "compute-3"] {
        let p = placement
            .provider_by_name(&format!("blazar_{host}"))
            .await
            .unwrap()
            .unwrap();
        let inventory = placement.inventories(&p.uuid).await.unwrap();
        if let Some((_, total, ..)) = inventory.iter().find(|(c, ..)| c == &class) {
            // Its whole reservation provider goes (the slots with it).
            placement.delete_inventory(&p.uuid, &class).await.unwrap();
            placement.delete_provider(&p.uuid).await.unwrap();
            emptied = Some((p.name.clone(), *total));
            break;
        }
    }
    let (emptied, slots) = emptied.expect("a host with slots");
    let at = format!("/v2.0/floatingips?floating_ip_address={address}");
    let fip = neutron(&admin, Method::GET, &at, None).await["floatingips"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/floatingips/{fip}"),
        None,
    )
    .await;
    let on_segment = "/v2.0/networks?provider%3Asegmentation_id=151";
    let net = neutron(&admin, Method::GET, on_segment, None).await["networks"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/networks/{net}"),
        None,
    )
    .await;
    // Leave orphans: the flavor of an instance reservation this database had, whose lease
    // was deleted, made again by hand; and a reservation flavor, a class, server groups and
    // a tagged network of reservations it never had (another Blazar's on the same cloud, or
    // one blazar-rs is replacing): those are listed and left, their servers never deleted.
    compute(
        &admin,
        Method::POST,
        "/flavors",
        Some(
            json!({"flavor": {"id": known, "name": format!("reservation:{known}"),
            "vcpus": 1, "ram": 64, "disk": 1, "os-flavor-access:is_public": false}}),
        ),
    )
    .await;
    let ghost = "5f1d2c3b-aaaa-4bbb-8ccc-000000000001";
    compute(
        &admin,
        Method::POST,
        "/flavors",
        Some(
            json!({"flavor": {"id": ghost, "name": format!("reservation:{ghost}"),
            "vcpus": 1, "ram": 64, "disk": 1, "os-flavor-access:is_public": false}}),
        ),
    )
    .await;
    let ghost_class = format!(
        "CUSTOM_RESERVATION_{}",
        ghost.to_uppercase().replace('-', "_")
    );
    placement.ensure_resource_class(&ghost_class).await.unwrap();
    // Two groups of the ghost's (two attempts that raced each made one).
    for _ in 0..2 {
        compute(
            &admin,
            Method::POST,
            "/os-server-groups",
            Some(
                json!({"server_group": {"name": format!("reservation:{ghost}"),
                "policies": ["affinity"]}}),
            ),
        )
        .await;
    }
    let stray = neutron(
        &admin,
        Method::POST,
        "/v2.0/networks",
        Some(json!({"network": {"name": "stray"}})),
    )
    .await["network"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    neutron(
        &admin,
        Method::PUT,
        &format!("/v2.0/networks/{stray}/tags"),
        Some(json!({"tags": ["blazar", "reservation:5f1d2c3b-aaaa-4bbb-8ccc-000000000002"]})),
    )
    .await;

    let drift = reconcile(true).await;
    let has = |needle: &str| drift.iter().any(|l| l.contains(needle));
    assert!(has("may not use the flavor"), "{drift:#?}");
    assert!(
        has(&format!("project {beta} may use the flavor")),
        "{drift:#?}"
    );
    assert!(
        has(&format!("metadata {intruder} not as granted")),
        "{drift:#?}"
    );
    assert!(has("slot(s) of instance reservation"), "{drift:#?}");
    assert!(
        has(&format!(
            "extra specs blazar-test:stray, resources:{class} not as granted"
        )),
        "{drift:#?}"
    );
    assert!(has(&format!("floating IP {address}")), "{drift:#?}");
    assert!(has("network on segment vlan/151"), "{drift:#?}");
    assert!(
        has(&format!(
            "host {stray_host} in the aggregate of instance reservation {rid} without slots"
        )),
        "{drift:#?}"
    );

    assert!(
        has(&format!("instance reservation {known} is over or gone")),
        "{drift:#?}"
    );
    assert!(
        has(&format!(
            "instance reservation {ghost} is not one of this database's"
        )),
        "{drift:#?}"
    );
    assert!(
        has(&format!(
            "network {stray} of reservation 5f1d2c3b-aaaa-4bbb-8ccc-000000000002, not one \
             of this database's: left"
        )),
        "{drift:#?}"
    );
    assert!(!has("belongs to no reservation in force"), "{drift:#?}");
    // A dry run changes nothing.
    assert!(!nova.flavor_access(&rid).await.unwrap().contains(&alpha));
    let repaired = reconcile(false).await;
    assert_eq!(repaired, drift);
    assert_eq!(nova.flavor_access(&rid).await.unwrap(), vec![alpha.clone()]);

    let aggregate = nova.find_aggregate(&rid).await.unwrap().unwrap();
    let mut now_held = aggregate.hosts.clone();
    now_held.sort();
    let mut was_held = granted_hosts.clone();
    was_held.sort();
    assert_eq!(now_held, was_held);
    assert!(
        !aggregate.metadata.contains_key(intruder),
        "{:?}",
        aggregate.metadata
    );
    let specs = compute(&admin, Method::GET, &format!("/flavors/{rid}"), None).await["flavor"]
        ["extra_specs"]
        .clone();
    let group = group_of(&app.get(&format!("/v1/leases/{lease_id}")).await.body);
    assert_eq!(
        specs,
        json!({"aggregate_instance_extra_specs:reservation": rid,
            "affinity_id": group,
            format!("resources:{class}"): "1"}),
    );
    let remade = placement.provider_by_name(&emptied).await.unwrap();
    let back = placement
        .inventories(&remade.expect("the provider made again").uuid)
        .await
        .unwrap();
    assert!(
        back.iter()
            .any(|(c, total, ..)| c == &class && *total == slots),
        "{back:?}"
    );
    let remade = neutron(&admin, Method::GET, &at, None).await;
    assert_eq!(
        remade["floatingips"][0]["project_id"],
        json!(alpha),
        "{remade}"
    );
    let renet = neutron(&admin, Method::GET, on_segment, None).await;
    assert_eq!(renet["networks"][0]["project_id"], json!(alpha), "{renet}");
    assert!(nova.flavor(&known).await.unwrap().is_none());
    // What was never this database's is still there; taken away by hand, as an operator
    // would once they know whose it was.
    assert!(nova.flavor(ghost).await.unwrap().is_some());
    nova.delete_flavor(ghost).await.unwrap();
    let groups = nova.server_groups(true).await.unwrap();
    let ghost_groups: Vec<&String> = groups
        .iter()
        .filter(|(_, name)| name.starts_with(&format!("reservation:{ghost}")))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ghost_groups.len(), 2, "{groups:?}");
    for id in ghost_groups {
        compute(
            &admin,
            Method::DELETE,
            &format!("/os-server-groups/{id}"),
            None,
        )
        .await;
    }
    assert!(
        placement
            .reservation_classes()
            .await
            .unwrap()
            .contains(&ghost_class)
    );
    placement_call(
        &admin,
        Method::DELETE,
        &format!("/resource_classes/{ghost_class}"),
        None,
    )
    .await;
    let left = neutron(&admin, Method::GET, "/v2.0/networks?name=stray", None).await;
    assert_eq!(left["networks"].as_array().unwrap().len(), 1, "{left}");
    neutron(
        &admin,
        Method::DELETE,
        &format!("/v2.0/networks/{stray}"),
        None,
    )
    .await;
    assert_eq!(
        reconcile(true).await,
        Vec::<String>::new(),
        "drift after repair"
    );

    // The server group deleted by hand: made again, and the one the reservation names
    // (users boot with it as their hint).
    let old_group = group_of(&app.get(&format!("/v1/leases/{lease_id}")).await.body);
    compute(
        &admin,
        Method::DELETE,
        &format!("/os-server-groups/{old_group}"),
        None,
    )
    .await;
    let regrouped = reconcile(false).await;
    assert!(
        regrouped.iter().any(|l| l.contains(&format!(
            "server group of instance reservation {rid} missing"
        ))),
        "{regrouped:#?}"
    );
    let new_group = group_of(&app.get(&format!("/v1/leases/{lease_id}")).await.body);
    assert_ne!(new_group, old_group);
    compute(
        &admin,
        Method::GET,
        &format!("/os-server-groups/{new_group}"),
        None,
    )
    .await;
    assert_eq!(
        reconcile(true).await,
        Vec::<String>::new(),
        "drift after the group was made again"
    );

    // A host's slots overcommitted eightfold would let alpha run more servers than it
    // booked: put back to one server a slot.
    let mut overcommitted = None;
    for host in ["compute-1", "compute-2", "compute-3"] {
        let Some(p) = placement
            .provider_by_name(&format!("blazar_{host}"))
            .await
            .unwrap()
        else {
            continue;
        };
        if placement
            .inventory_of(&p.uuid, &class)
            .await
            .unwrap()
            .is_some()
        {
            let path = format!("/resource_providers/{}/inventories/{class}", p.uuid);
            let mut changed = placement_call(&admin, Method::GET, &path, None).await;
            changed["allocation_ratio"] = json!(8.0);
            placement_call(&admin, Method::PUT, &path, Some(changed)).await;
            overcommitted = Some(path);
            break;
        }
    }
    let overcommitted = overcommitted.expect("a host with slots");
    // And the flavor is deleted and another one made under its name (Nova names are unique).
    nova.delete_flavor(&rid).await.unwrap();
    let squatter = compute(
        &admin,
        Method::POST,
        "/flavors",
        Some(
            json!({"flavor": {"name": format!("reservation:{rid}"), "vcpus": 1, "ram": 64,
            "disk": 1}}),
        ),
    )
    .await["flavor"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let drift = reconcile(false).await;
    assert!(
        drift
            .iter()
            .any(|l| l.contains(&format!("flavor of instance reservation {rid} missing"))),
        "{drift:#?}"
    );
    assert!(nova.flavor(&squatter).await.unwrap().is_none());
    assert_eq!(nova.flavor_access(&rid).await.unwrap(), vec![alpha.clone()]);
    assert!(
        drift.iter().any(|l| l.contains("are not one server each")),
        "{drift:#?}"
    );
    let ratio = placement_call(&admin, Method::GET, &overcommitted, None).await;
    assert_eq!(ratio["allocation_ratio"], json!(1.0), "{ratio}");

    // A host's slots raised by hand let alpha run one server more than it booked: the
    // inventory is put back, and the server over it is reported and left to its owner.
    let mut raised = None;
    for host in ["compute-1", "compute-2", "compute-3"] {
        let Some(p) = placement
            .provider_by_name(&format!("blazar_{host}"))
            .await
            .unwrap()
        else {
            continue;
        };
        if let Some(inventory) = placement.inventory_of(&p.uuid, &class).await.unwrap() {
            let path = format!("/resource_providers/{}/inventories/{class}", p.uuid);
            let mut changed = inventory.clone();
            let n = inventory["total"].as_i64().unwrap();
            changed["total"] = json!(n + 1);
            changed["resource_provider_generation"] = placement_call(
                &admin,
                Method::GET,
                &path,
                None,
            )
            .await["resource_provider_generation"]
                .clone();
            placement_call(&admin, Method::PUT, &path, Some(changed)).await;
            raised = Some((p.name.clone(), path, n));
            break;
        }
    }
    let (raised, path, n) = raised.expect("a host with slots");
    let member = env.member("alpha");
    for i in 0..3 {
        let (server, status) = boot_flavor(&member, &format!("over-{i}"), &rid).await;
        assert_eq!(status, "ACTIVE", "{server}");
    }
    let report = reconcile_report(&app, false).await;
    let over = format!(
        "{raised} runs {} server(s) of instance reservation {rid} on {n} slot(s): left",
        n + 1
    );
    let repairs = report_lines(&report, "repairs");
    assert_eq!(repairs.len(), 2, "{report}");
    assert_eq!(repairs[0], over, "{report}");
    assert!(
        repairs[1].contains(&format!("{raised} has {} slot(s)", n + 1)),
        "{report}"
    );
    let total = placement_call(&admin, Method::GET, &path, None).await;
    assert_eq!(total["total"], json!(n), "{total}");
    assert_eq!(reconcile(true).await, vec![over]);

    // The flavor made public by hand (deleted and made again so: Nova cannot change that
    // in place), and beta boots with it into alpha's slots: the flavor is made private
    // again, and beta's server goes.
    nova.clear_flavor(&rid, Duration::from_secs(60))
        .await
        .unwrap();
    let specs = compute(&admin, Method::GET, &format!("/flavors/{rid}"), None).await["flavor"]
        ["extra_specs"]
        .clone();
    nova.delete_flavor(&rid).await.unwrap();
    compute(
        &admin,
        Method::POST,
        "/flavors",
        Some(
            json!({"flavor": {"id": rid, "name": format!("reservation:{rid}"), "vcpus": 1,
            "ram": 64, "disk": 1, "os-flavor-access:is_public": true}}),
        ),
    )
    .await;
    compute(
        &admin,
        Method::POST,
        &format!("/flavors/{rid}/os-extra_specs"),
        Some(json!({ "extra_specs": specs })),
    )
    .await;
    let (stranger, status) = boot_flavor(&env.member("beta"), "stranger", &rid).await;
    let drift = reconcile(false).await;
    assert!(
        drift.iter().any(|l| l.contains(&format!(
            "flavor of instance reservation {rid}: size or visibility not as granted"
        ))),
        "{drift:#?}"
    );
    assert!(
        drift.iter().any(|l| l.contains(&format!(
            "server {stranger} of another project runs with the flavor"
        ))),
        "{status}: {drift:#?}"
    );
    let flavor = compute(&admin, Method::GET, &format!("/flavors/{rid}"), None).await;
    assert_eq!(flavor["flavor"]["os-flavor-access:is_public"], false);
    assert_eq!(nova.flavor_access(&rid).await.unwrap(), vec![alpha.clone()]);
    let mut left = Vec::new();
    for _ in 0..120 {
        left = nova.servers_with_flavor(&rid).await.unwrap();
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        reconcile(true).await,
        Vec::<String>::new(),
        "drift after the flavor was made private again"
    );

    // The end takes back what was made again.
    app.tick_at(t(2030, 6, 1, 12, 0)).await;
    let (status, actions) = lease_status(&app, &lease_id).await;
    assert_eq!(status, "TERMINATED", "{actions}");
    assert!(nova.flavor(&rid).await.unwrap().is_none());
    let left = neutron(&admin, Method::GET, &at, None).await;
    assert!(left["floatingips"].as_array().unwrap().is_empty(), "{left}");
    reset_cloud(&admin).await;
    withdraw(&app, &admin, &host_ids).await;
}
