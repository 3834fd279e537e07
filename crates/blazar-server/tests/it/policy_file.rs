//! Operator policy files: overrides over HTTP, the lease-target fix, refusals at start that
//! name the line, and `blazar-server policy show`.

use blazar_server::auth::Auth;
use blazar_server::policy::Policy;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::TestDatabase;
use crate::matrix::AuthApp;
use crate::support::{blazar_server, free_port};

fn noauth() -> impl FnOnce(&blazar_db::Store) -> Auth {
    |_| Auth::noauth("admin-project", "admin-user")
}

const ADMIN: &[(&str, &str)] = &[];
const ALPHA_MEMBER: &[(&str, &str)] = &[
    ("X-Project-Id", "alpha"),
    ("X-User-Id", "alice"),
    ("X-Roles", "member"),
];
const BETA_MEMBER: &[(&str, &str)] = &[
    ("X-Project-Id", "beta"),
    ("X-User-Id", "bob"),
    ("X-Roles", "member"),
];
const OPERATOR: &[(&str, &str)] = &[
    ("X-Project-Id", "ops"),
    ("X-User-Id", "olga"),
    ("X-Roles", "operator"),
];

fn lease() -> Value {
    json!({
        "name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                          "hypervisor_properties": "", "resource_properties": ""}],
    })
}

#[tokio::test]
async fn a_policy_file_overrides_rules_over_http() {
    let policy = Policy::from_yaml(
        "# Only admins create leases; operators read the inventory.\n\
         \"blazar:leases:post\": \"rule:admin\"\n\
         \"blazar:oshosts:get\": \"rule:admin or rule:operators\"\n\
         operators: role:operator\n",
    )
    .unwrap();
    let app = AuthApp::spawn(noauth(), policy).await;
    let r = app
        .call(
            None,
            Method::POST,
            "/v1/os-hosts",
            Some(json!({"name": "h1"})),
            ADMIN,
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    app.call(
        None,
        Method::POST,
        "/v1/leases",
        Some(lease()),
        ALPHA_MEMBER,
    )
    .await
    .assert_denied("blazar:leases:post");
    app.call(None, Method::POST, "/v1/leases", Some(lease()), ADMIN)
        .await
        .assert_status(StatusCode::CREATED);
    let r = app
        .call(None, Method::GET, "/v1/os-hosts", None, OPERATOR)
        .await;
    r.assert_status(StatusCode::OK);
    assert_eq!(r.body["hosts"][0]["hypervisor_hostname"], "h1");
    // Rules the file leaves alone keep Blazar's defaults.
    app.call(None, Method::GET, "/v1/os-hosts", None, ALPHA_MEMBER)
        .await
        .assert_denied("blazar:oshosts:get");
    app.call(
        None,
        Method::POST,
        "/v1/os-hosts",
        Some(json!({"name": "h2"})),
        OPERATOR,
    )
    .await
    .assert_denied("blazar:oshosts:post");
}

/// Blazar evaluates `put` and `delete` on the caller's own project (spec section 12, item
/// 22): with a policy letting everyone see every lease, any member could change any lease.
/// Here they are evaluated on the lease's project.
#[tokio::test]
async fn update_and_delete_are_checked_against_the_leases_project() {
    let policy = Policy::from_yaml("blazar:leases:get: \"@\"\n").unwrap();
    let app = AuthApp::spawn(noauth(), policy).await;
    app.call(
        None,
        Method::POST,
        "/v1/os-hosts",
        Some(json!({"name": "h1"})),
        ADMIN,
    )
    .await
    .assert_status(StatusCode::CREATED);
    let r = app
        .call(
            None,
            Method::POST,
            "/v1/leases",
            Some(lease()),
            ALPHA_MEMBER,
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    let path = format!("/v1/leases/{}", r.body["lease"]["id"].as_str().unwrap());
    // Visible to beta now, by the operator's choice...
    app.call(None, Method::GET, &path, None, BETA_MEMBER)
        .await
        .assert_status(StatusCode::OK);
    // ...but not beta's to change.
    app.call(
        None,
        Method::PUT,
        &path,
        Some(json!({"name": "mine"})),
        BETA_MEMBER,
    )
    .await
    .assert_denied("blazar:leases:put");
    app.call(None, Method::DELETE, &path, None, BETA_MEMBER)
        .await
        .assert_denied("blazar:leases:delete");
    app.call(None, Method::DELETE, &path, None, ALPHA_MEMBER)
        .await
        .assert_status(StatusCode::NO_CONTENT);
}

fn write(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn a_bad_policy_file_stops_the_start_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDatabase::new().await;
    let listen = format!("127.0.0.1:{}", free_port());
    let cases = [
        (
            "admin: role:admin\nblazar:leases:get: role:reader and\n",
            "line 2: rule 'blazar:leases:get': cannot read",
        ),
        (
            "# typo below\n\nblazar:lease:delete: rule:admin\n",
            "line 3: unknown rule name 'blazar:lease:delete'",
        ),
        (
            "blazar:leases:get: rule:nobody\n",
            "line 1: rule 'blazar:leases:get' refers to rule:nobody",
        ),
        ("blazar:leases:get: \"role:a\n", "line 1: not valid YAML"),
    ];
    for (text, expected) in cases {
        let path = write(&dir, text);
        let out = blazar_server(&[
            "--policy-file",
            &path,
            "--listen",
            &listen,
            "--database-url",
            &db.url,
        ])
        .await;
        assert!(!out.status.success(), "{text}");
        assert!(out.stderr.contains(&path), "{}", out.stderr);
        assert!(out.stderr.contains(expected), "{text}: {}", out.stderr);
        // `policy show` refuses it the same way.
        let show = blazar_server(&["policy", "show", "--policy-file", &path]).await;
        assert!(!show.status.success());
        assert!(show.stderr.contains(expected), "{}", show.stderr);
    }
    let out = blazar_server(&[
        "policy",
        "show",
        "--policy-file",
        "/nonexistent/policy.yaml",
    ])
    .await;
    assert!(!out.status.success());
    assert!(out.stderr.contains("cannot read it"), "{}", out.stderr);
}

#[tokio::test]
async fn policy_show_prints_the_effective_rules_as_a_policy_file() {
    let defaults = blazar_server(&["policy", "show"]).await;
    assert!(defaults.status.success(), "{}", defaults.stderr);
    for line in [
        "\"admin\": \"is_admin:True or role:admin\"",
        "\"project_member_api\": \"role:member and project_id:%(project_id)s\"",
        "\"blazar:leases:get\": \"rule:project_reader_or_admin\"",
        "\"blazar:leases:delete\": \"rule:project_member_or_admin\"",
        "\"blazar:oshosts:update_resource_properties\": \"rule:admin\"",
        "\"blazar:floatingips:get\": \"rule:project_reader_or_admin\"",
    ] {
        assert!(
            defaults.stdout.lines().any(|l| l == line),
            "{line} in\n{}",
            defaults.stdout
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "blazar:leases:post: rule:admin\nops: role:operator\nblazar:oshosts:get: rule:ops\n",
    );
    let shown = blazar_server(&["policy", "show", "--policy-file", &path]).await;
    assert!(shown.status.success(), "{}", shown.stderr);
    assert!(
        shown.stdout.contains(
            "\"blazar:leases:post\": \"rule:admin\"  # from line 1 (default: \"rule:project_member_or_admin\")"
        ),
        "{}",
        shown.stdout
    );
    assert!(
        shown
            .stdout
            .contains("\"ops\": \"role:operator\"  # from line 2")
    );
    // The output is itself a policy file giving the same rules.
    let again_path = dir.path().join("again.yaml");
    std::fs::write(&again_path, &shown.stdout).unwrap();
    let again = blazar_server(&[
        "policy",
        "show",
        "--policy-file",
        &again_path.display().to_string(),
    ])
    .await;
    assert!(again.status.success(), "{}", again.stderr);
    let rules = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split("  #").next().unwrap().to_string())
            .collect()
    };
    assert_eq!(rules(&shown.stdout), rules(&again.stdout));
}

fn host_lease(props: &str) -> Value {
    json!({
        "name": "l", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
        "reservations": [{"resource_type": "physical:host", "min": 3, "max": 3,
                          "hypervisor_properties": "", "resource_properties": props}],
    })
}

fn fip_lease(address: &str) -> Value {
    json!({
        "name": "f", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
        "reservations": [{"resource_type": "virtual:floatingip", "network_id": "net-1",
                          "amount": 1, "required_floatingips": [address]}],
    })
}

/// Two hosts with a private property, and an address that project beta holds.
async fn refusal_setup(app: &AuthApp) {
    let calls = [
        (
            Method::POST,
            "/v1/os-hosts",
            json!({"name": "h1", "secret_rack": "r1"}),
            StatusCode::CREATED,
        ),
        (
            Method::POST,
            "/v1/os-hosts",
            json!({"name": "h2", "secret_rack": "r2"}),
            StatusCode::CREATED,
        ),
        (
            Method::PATCH,
            "/v1/os-hosts/properties/secret_rack",
            json!({"private": true}),
            StatusCode::OK,
        ),
        (
            Method::POST,
            "/v1/floatingips",
            json!({"floating_network_id": "net-1", "floating_ip_address": "10.0.0.5"}),
            StatusCode::CREATED,
        ),
    ];
    for (method, path, body, status) in calls {
        let r = app.call(None, method, path, Some(body), ADMIN).await;
        assert_eq!(r.status, status, "{path}: {}", r.body);
    }
    let r = app
        .call(
            None,
            Method::POST,
            "/v1/leases",
            Some(fip_lease("10.0.0.5")),
            BETA_MEMBER,
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

async fn refusal(app: &AuthApp, body: Value, who: &[(&str, &str)]) -> String {
    let r = app
        .call(None, Method::POST, "/v1/leases", Some(body), who)
        .await;
    // Blazar's status for a floating-IP shortfall is 400, for the others ours is 409.
    let expected = if r.body["reasons"][0]["resource_type"] == "virtual:floatingip" {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::CONFLICT
    };
    assert_eq!(r.status, expected, "{}", r.body);
    r.body["error_message"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn refusals_explain_by_policy_and_never_through_private_properties() {
    let private_query = r#"["==", "$secret_rack", "r1"]"#;

    // Blazar's default rules: counts for everyone...
    let app = AuthApp::spawn(noauth(), Policy::load(None).unwrap()).await;
    refusal_setup(&app).await;
    let m = refusal(&app, host_lease(""), ALPHA_MEMBER).await;
    assert!(m.contains("2 host(s) match the filters"), "{m}");
    let m = refusal(&app, fip_lease("10.0.0.5"), ALPHA_MEMBER).await;
    assert!(m.contains("is already reserved in that window"), "{m}");
    // ...but a count over a private property would tell a member which hosts have it.
    let m = refusal(&app, host_lease(private_query), ALPHA_MEMBER).await;
    assert_eq!(m, "Not enough hosts available");
    let m = refusal(&app, host_lease(private_query), ADMIN).await;
    assert!(m.contains("1 host(s) match the filters"), "{m}");

    // An operator who wants Blazar's bare messages for members says so.
    let policy = Policy::from_yaml("\"blazar:leases:explain_refusal\": \"rule:admin\"\n").unwrap();
    let app = AuthApp::spawn(noauth(), policy).await;
    refusal_setup(&app).await;
    assert_eq!(
        refusal(&app, host_lease(""), ALPHA_MEMBER).await,
        "Not enough hosts available"
    );
    assert_eq!(
        refusal(&app, fip_lease("10.0.0.5"), ALPHA_MEMBER).await,
        "Not enough floating IPs available"
    );
    assert_eq!(
        refusal(&app, fip_lease("10.9.9.9"), ALPHA_MEMBER).await,
        "Not enough floating IPs available"
    );
    let m = refusal(&app, host_lease(""), ADMIN).await;
    assert!(m.contains("2 host(s) match the filters"), "{m}");
}
