//! The authorization matrix every token mode must pass: two projects, each with an admin, a
//! member and a reader, driving every policy decision of leases and inventory through real
//! HTTP with real tokens (Keystone's in `keystone.rs`, standalone ones in `tokens.rs`).

use blazar_db::Store;
use blazar_server::auth::Auth;
use blazar_server::policy::Policy;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::TestApp;

/// A reply: the kit's response, with its policy and authentication assertions.
pub use blazar_testkit::Response as Reply;

/// A server on a loopback port with the given authentication and policy, built as
/// production builds it; requests carry out no actions.
pub struct AuthApp {
    pub store: Store,
    app: TestApp,
}

impl AuthApp {
    pub async fn spawn(
        auth: impl FnOnce(&Store) -> Auth + Send + 'static,
        policy: Policy,
    ) -> AuthApp {
        let app = TestApp::builder()
            .auth_with(auth)
            .policy(policy)
            .max_connections(8)
            .auto_actions(false)
            .spawn()
            .await;
        AuthApp {
            store: app.store().clone(),
            app,
        }
    }

    /// A request with `token` (if any) and extra headers.
    pub async fn call(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        self.app.call(token, method, path, body, headers).await
    }

    pub async fn as_actor(
        &self,
        actor: &Actor,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Reply {
        self.call(Some(&actor.token), method, path, body, &[]).await
    }
}

/// Someone holding a token.
#[derive(Debug, Clone)]
pub struct Actor {
    pub name: String,
    pub token: String,
    pub user_id: String,
    pub project_id: String,
}

/// Two projects, alpha and beta, each with an admin, a member and a reader.
#[derive(Debug, Clone)]
pub struct Cast {
    pub alpha_admin: Actor,
    pub alpha_member: Actor,
    pub alpha_reader: Actor,
    pub beta_admin: Actor,
    pub beta_member: Actor,
    pub beta_reader: Actor,
}

fn lease_body(name: &str) -> Value {
    json!({
        "name": name,
        "start_date": "2030-01-01 10:00",
        "end_date": "2030-01-01 12:00",
        "reservations": [{
            "resource_type": "physical:host",
            "min": 1,
            "max": 1,
            "hypervisor_properties": "",
            "resource_properties": "",
        }],
    })
}

fn lease_ids(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let mut ids: Vec<String> = reply.body["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| l["id"].as_str().expect("id").to_string())
        .collect();
    ids.sort();
    ids
}

/// Every policy decision of spec section 10 (with the lease-target fix of section 12, item
/// 22), allowed and denied, through real HTTP.
pub async fn run_policy_matrix(app: &AuthApp, cast: &Cast) {
    use Method as M;
    let Cast {
        alpha_admin,
        alpha_member,
        alpha_reader,
        beta_admin,
        beta_member,
        beta_reader,
    } = cast;

    // Authentication: no token or a bad one is Keystone's 401 on every API route; the
    // version document and the health check stay open.
    for path in ["/v1/leases", "/v1/os-hosts", "/v1/nothing-here"] {
        app.call(None, M::GET, path, None, &[])
            .await
            .assert_unauthorized();
        app.call(Some("not-a-token"), M::GET, path, None, &[])
            .await
            .assert_unauthorized();
    }
    app.call(None, M::POST, "/v1/leases", Some(lease_body("x")), &[])
        .await
        .assert_unauthorized();
    app.call(None, M::GET, "/", None, &[])
        .await
        .assert_status(StatusCode::MULTIPLE_CHOICES);
    app.call(None, M::GET, "/healthz", None, &[])
        .await
        .assert_status(StatusCode::OK);

    // Inventory is admin-managed: members and readers are refused every host action.
    let r = app
        .as_actor(
            alpha_admin,
            M::POST,
            "/v1/os-hosts",
            Some(json!({"name": "compute-1"})),
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    let host1 = r.body["host"]["id"].as_str().expect("host id").to_string();
    for actor in [alpha_member, alpha_reader, beta_member, beta_reader] {
        app.as_actor(
            actor,
            M::POST,
            "/v1/os-hosts",
            Some(json!({"name": "compute-x"})),
        )
        .await
        .assert_denied("blazar:oshosts:post");
        app.as_actor(actor, M::GET, "/v1/os-hosts", None)
            .await
            .assert_denied("blazar:oshosts:get");
        app.as_actor(actor, M::GET, &format!("/v1/os-hosts/{host1}"), None)
            .await
            .assert_denied("blazar:oshosts:get");
        app.as_actor(
            actor,
            M::PUT,
            &format!("/v1/os-hosts/{host1}"),
            Some(json!({"values": {"gpu": "true"}})),
        )
        .await
        // Blazar looks the host up under `oshosts:get` before its own rule.
        .assert_denied("blazar:oshosts:get");
        app.as_actor(actor, M::DELETE, &format!("/v1/os-hosts/{host1}"), None)
            .await
            .assert_denied("blazar:oshosts:get");
        app.as_actor(actor, M::GET, "/v1/os-hosts/allocations", None)
            .await
            .assert_denied("blazar:oshosts:get_allocations");
        app.as_actor(actor, M::GET, "/v1/os-hosts/properties", None)
            .await
            .assert_denied("blazar:oshosts:get_resource_properties");
        app.as_actor(
            actor,
            M::PATCH,
            "/v1/os-hosts/properties/gpu",
            Some(json!({"private": true})),
        )
        .await
        .assert_denied("blazar:oshosts:update_resource_properties");
    }
    // Any project's admin manages inventory (Blazar's admin rule is not project-bound).
    let r = app
        .as_actor(
            beta_admin,
            M::POST,
            "/v1/os-hosts",
            Some(json!({"name": "compute-2"})),
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    app.as_actor(alpha_admin, M::GET, "/v1/os-hosts", None)
        .await
        .assert_status(StatusCode::OK);
    app.as_actor(beta_admin, M::GET, "/v1/os-hosts/allocations", None)
        .await
        .assert_status(StatusCode::OK);

    // Identity headers are noauth's; with a token they change nothing.
    let spoof = [
        ("X-Project-Id", beta_member.project_id.as_str()),
        ("X-User-Id", beta_member.user_id.as_str()),
        ("X-Roles", "admin"),
    ];
    app.call(
        Some(&alpha_member.token),
        M::GET,
        "/v1/os-hosts",
        None,
        &spoof,
    )
    .await
    .assert_denied("blazar:oshosts:get");

    // Leases: members create in their own project; readers may not.
    let r = app
        .call(
            Some(&alpha_member.token),
            M::POST,
            "/v1/leases",
            Some(lease_body("alpha-lease")),
            &spoof,
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    assert_eq!(
        r.body["lease"]["project_id"],
        alpha_member.project_id.as_str()
    );
    assert_eq!(r.body["lease"]["user_id"], alpha_member.user_id.as_str());
    let alpha_lease = r.body["lease"]["id"].as_str().expect("id").to_string();
    for reader in [alpha_reader, beta_reader] {
        app.as_actor(reader, M::POST, "/v1/leases", Some(lease_body("nope")))
            .await
            .assert_denied("blazar:leases:post");
    }
    let r = app
        .as_actor(
            beta_member,
            M::POST,
            "/v1/leases",
            Some(lease_body("beta-lease")),
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    assert_eq!(
        r.body["lease"]["project_id"],
        beta_member.project_id.as_str()
    );
    let beta_lease = r.body["lease"]["id"].as_str().expect("id").to_string();

    // Lists: each project sees its own leases only, readers included; admins see all.
    let mut both = vec![alpha_lease.clone(), beta_lease.clone()];
    both.sort();
    for (actor, expected) in [
        (alpha_member, vec![alpha_lease.clone()]),
        (alpha_reader, vec![alpha_lease.clone()]),
        (beta_member, vec![beta_lease.clone()]),
        (beta_reader, vec![beta_lease.clone()]),
        (alpha_admin, both.clone()),
        (beta_admin, both.clone()),
    ] {
        let ids = lease_ids(&app.as_actor(actor, M::GET, "/v1/leases", None).await);
        assert_eq!(ids, expected, "{}", actor.name);
    }
    // Asking for the other project's leases shows nothing rather than a refusal.
    let other = format!("/v1/leases?project_id={}", beta_member.project_id);
    let ids = lease_ids(&app.as_actor(alpha_member, M::GET, &other, None).await);
    assert!(ids.is_empty(), "{ids:?}");

    // Show: own project's readers may; another project's members get Blazar's 403.
    let alpha_path = format!("/v1/leases/{alpha_lease}");
    let beta_path = format!("/v1/leases/{beta_lease}");
    for actor in [alpha_member, alpha_reader, alpha_admin, beta_admin] {
        let r = app.as_actor(actor, M::GET, &alpha_path, None).await;
        r.assert_status(StatusCode::OK);
        assert_eq!(r.body["lease"]["id"], alpha_lease.as_str());
    }
    for actor in [beta_member, beta_reader] {
        app.as_actor(actor, M::GET, &alpha_path, None)
            .await
            .assert_denied("blazar:leases:get");
    }
    let r = app
        .as_actor(
            alpha_member,
            M::GET,
            "/v1/leases/00000000-0000-0000-0000-000000000000",
            None,
        )
        .await;
    r.assert_status(StatusCode::NOT_FOUND);

    // Update: readers may not; another project's member may not (the lease's project is
    // the target); the owner's member and any admin may.
    let rename = |name: &str| Some(json!({"name": name}));
    app.as_actor(alpha_reader, M::PUT, &alpha_path, rename("r"))
        .await
        .assert_denied("blazar:leases:put");
    app.as_actor(beta_member, M::PUT, &alpha_path, rename("b"))
        .await
        .assert_denied("blazar:leases:get");
    app.as_actor(alpha_member, M::PUT, &beta_path, rename("a"))
        .await
        .assert_denied("blazar:leases:get");
    let r = app
        .as_actor(alpha_member, M::PUT, &alpha_path, rename("alpha-renamed"))
        .await;
    r.assert_status(StatusCode::OK);
    assert_eq!(r.body["lease"]["name"], "alpha-renamed");
    let r = app
        .as_actor(beta_admin, M::PUT, &alpha_path, rename("by-beta-admin"))
        .await;
    r.assert_status(StatusCode::OK);

    // Delete: the same, and a refused delete leaves the lease in place.
    app.as_actor(alpha_reader, M::DELETE, &alpha_path, None)
        .await
        .assert_denied("blazar:leases:delete");
    app.as_actor(beta_member, M::DELETE, &alpha_path, None)
        .await
        .assert_denied("blazar:leases:get");
    app.as_actor(alpha_member, M::GET, &alpha_path, None)
        .await
        .assert_status(StatusCode::OK);
    app.as_actor(alpha_member, M::DELETE, &alpha_path, None)
        .await
        .assert_status(StatusCode::NO_CONTENT);
    app.as_actor(alpha_member, M::GET, &alpha_path, None)
        .await
        .assert_status(StatusCode::NOT_FOUND);
    app.as_actor(alpha_admin, M::DELETE, &beta_path, None)
        .await
        .assert_status(StatusCode::NO_CONTENT);

    // Hand-overs: readers see their project's.
    app.as_actor(beta_reader, M::GET, "/v1/handovers", None)
        .await
        .assert_status(StatusCode::OK);
}
