//! Racing real HTTP requests: no resource is ever granted twice.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::TestApp;

fn lease_body(name: &str, start: &str, end: &str, min: i64, max: i64) -> Value {
    json!({
        "name": name, "start_date": start, "end_date": end, "events": [],
        "reservations": [{"resource_type": "physical:host", "min": min, "max": max,
                          "hypervisor_properties": "", "resource_properties": ""}],
    })
}

/// Fifty concurrent creates for the only host and the same window: exactly one wins, the
/// others get a 409 that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_creates_for_one_host_grant_exactly_one() {
    let app = TestApp::spawn().await;
    app.create_host("only", json!({})).await;
    let requests = (0..50).map(|i| {
        app.post(
            "/v1/leases",
            lease_body(
                &format!("race-{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                1,
                1,
            ),
        )
    });
    let responses = join_all(requests).await;
    let created = responses
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    let refused: Vec<_> = responses
        .iter()
        .filter(|r| r.status == StatusCode::CONFLICT)
        .collect();
    assert_eq!(
        created,
        1,
        "{:?}",
        responses.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(refused.len(), 49);
    for r in refused {
        assert!(
            r.message().contains("Not enough hosts available"),
            "{}",
            r.message()
        );
        assert!(r.message().contains("0 of them free"), "{}", r.message());
    }
    assert_eq!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Many overlapping requests over a few hosts: afterwards no host carries two leases at one
/// instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_overlapping_leases_never_share_a_host() {
    let app = TestApp::spawn().await;
    for i in 0..4 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let requests = (0..40).map(|i| {
        let start_hour = 1 + (i % 6);
        let length = 1 + (i % 3);
        let min = 1 + (i % 2);
        app.post(
            "/v1/leases",
            lease_body(
                &format!("mix-{i}"),
                &format!("2030-01-01 {start_hour:02}:00"),
                &format!("2030-01-01 {:02}:00", start_hour + length),
                min,
                min + 1,
            ),
        )
    });
    let responses = join_all(requests).await;
    assert!(
        responses
            .iter()
            .all(|r| r.status == StatusCode::CREATED || r.status == StatusCode::CONFLICT)
    );
    assert!(responses.iter().any(|r| r.status == StatusCode::CREATED));
    assert_no_overlaps(&app).await;
}

/// Reads every allocation back through the API and checks the invariant.
pub async fn assert_no_overlaps(app: &TestApp) {
    let allocations = app.get("/v1/os-hosts/allocations").await.body["allocations"].clone();
    for entry in allocations.as_array().unwrap() {
        let mut windows: Vec<(String, String)> = entry["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["start_date"].as_str().unwrap().into(),
                    r["end_date"].as_str().unwrap().into(),
                )
            })
            .collect();
        windows.sort();
        for pair in windows.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "host {} double-booked: {:?}",
                entry["resource_id"],
                pair
            );
        }
    }
}

/// As many concurrent creates as there are hosts, each for one host in the same window:
/// every one is granted a host of its own. Writers that pick the same first free host pass
/// over each other's claims instead of failing and retrying until they give up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn as_many_concurrent_creates_as_hosts_are_all_granted_distinct_hosts() {
    let app = TestApp::spawn().await;
    for i in 0..24 {
        app.create_host(&format!("node-{i:02}"), json!({})).await;
    }
    let requests = (0..24).map(|i| {
        app.post(
            "/v1/leases",
            lease_body(
                &format!("one-each-{i}"),
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                1,
                1,
            ),
        )
    });
    let responses = join_all(requests).await;
    let statuses: Vec<_> = responses.iter().map(|r| r.status).collect();
    assert!(
        statuses.iter().all(|s| *s == StatusCode::CREATED),
        "{statuses:?} {:?}",
        responses
            .iter()
            .filter(|r| r.status != StatusCode::CREATED)
            .map(|r| r.message())
            .collect::<Vec<_>>()
    );
    let mut granted = Vec::new();
    for r in &responses {
        let id = r.body["lease"]["id"].as_str().unwrap();
        let hosts = app.get(&format!("/v1/leases/{id}/hosts")).await.body["hosts"].clone();
        let hosts = hosts.as_array().unwrap();
        assert_eq!(hosts.len(), 1, "{hosts:?}");
        granted.push(hosts[0]["id"].to_string());
    }
    granted.sort();
    granted.dedup();
    assert_eq!(granted.len(), 24, "two leases were given one host");
    let late = app
        .post(
            "/v1/leases",
            lease_body("late", "2030-01-01 11:00", "2030-01-01 13:00", 1, 1),
        )
        .await;
    assert_eq!(late.status, StatusCode::CONFLICT, "{}", late.message());
    assert_no_overlaps(&app).await;
}

/// Concurrent creates for floating IPs: as many creates as addresses, each for any one
/// address, are all served with distinct addresses; of creates that all require one
/// address of another network, exactly one wins and the others are told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_floating_ip_creates_share_out_the_pool_and_one_wins_a_required_address() {
    let app = TestApp::spawn().await;
    let addresses = [("net-1", 1..=12), ("net-2", 1..=3)];
    for (network, range) in addresses {
        for i in range {
            let r = app
                .post(
                    "/v1/floatingips",
                    json!({"floating_network_id": network,
                           "floating_ip_address": format!("10.{}.0.{i}", &network[4..])}),
                )
                .await;
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.message());
        }
    }
    let body = |name: String, network: &str, required: Option<&str>| {
        let mut reservation = json!({"resource_type": "virtual:floatingip",
                                     "network_id": network, "amount": 1});
        if let Some(address) = required {
            reservation["required_floatingips"] = json!([address]);
        }
        json!({"name": name, "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
               "events": [], "reservations": [reservation]})
    };
    let any = (0..12).map(|i| app.post("/v1/leases", body(format!("any-{i}"), "net-1", None)));
    let required = (0..10).map(|i| {
        app.post(
            "/v1/leases",
            body(format!("required-{i}"), "net-2", Some("10.2.0.2")),
        )
    });
    let (any, required) = futures::join!(join_all(any), join_all(required));
    let failed: Vec<_> = any
        .iter()
        .filter(|r| r.status != StatusCode::CREATED)
        .map(|r| (r.status, r.message()))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let winners = required
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    assert_eq!(winners, 1, "exactly one lease gets the required address");
    for r in required.iter().filter(|r| r.status != StatusCode::CREATED) {
        // Blazar's status for a floating-IP shortfall.
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.message());
        assert!(
            r.message().contains("required floating IP"),
            "{}",
            r.message()
        );
    }
    let allocations = app.get("/v1/floatingips/allocations").await.body["allocations"].clone();
    let mut held = 0;
    for entry in allocations.as_array().unwrap() {
        let n = entry["reservations"].as_array().unwrap().len();
        assert!(n <= 1, "address {} held {n} times", entry["resource_id"]);
        held += n;
    }
    assert_eq!(
        held, 13,
        "twelve addresses of net-1 and the required one of net-2"
    );
}

/// On PostgreSQL a writer claims what it keeps (waiting, in id order) before it claims
/// anything else, so two writers can never each hold what the other waits for: a circle
/// PostgreSQL breaks only after `deadlock_timeout`, a second per round, which made
/// concurrent lease updates take seconds. Here another transaction holds the one host a
/// lease keeps while the lease is extended: the update waits for that host holding no
/// other claim (it used to claim a spare host first), then goes through. SQLite's writers
/// are serialised: nothing to check there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_update_waits_for_the_host_it_keeps_holding_no_other_claim() {
    let Some((app, url)) = postgres_app().await else {
        return;
    };
    let schema = schema_of(&url);
    for i in 0..3 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let lease = app
        .post(
            "/v1/leases",
            lease_body("kept", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1),
        )
        .await;
    lease.assert_status(StatusCode::CREATED);
    let id = lease.body["lease"]["id"].as_str().unwrap().to_string();
    let held = app
        .get(&format!("/v1/os-hosts/allocations?lease_id={id}"))
        .await;
    let host: i64 = held.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| !a["reservations"].as_array().unwrap().is_empty())
        .and_then(|a| a["resource_id"].as_str())
        .unwrap()
        .parse()
        .unwrap();

    // Another writer holds the host.
    let other = other_writer(url.clone()).await;
    let mut holder = other.write().await.unwrap();
    holder
        .claim_resources("physical:host", &[host])
        .await
        .unwrap();

    let watch = async {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        // Until the update waits: then what its session holds in the claims' key space.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        let held_while_waiting = loop {
            let waiting: Option<(i32, i64)> = sqlx::query_as(
                "SELECT l.pid, CAST(l.classid AS BIGINT) FROM pg_locks l \
                 JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1",
            )
            .bind(&schema)
            .fetch_optional(&mut conn)
            .await
            .unwrap();
            if let Some((pid, space)) = waiting {
                let (held,): (i64,) = sqlx::query_as(
                    "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
                     AND pid = $1 AND CAST(classid AS BIGINT) = $2",
                )
                .bind(pid)
                .bind(space)
                .fetch_one(&mut conn)
                .await
                .unwrap();
                break held;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the update never waited for the host"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        holder.commit().await.unwrap();
        held_while_waiting
    };
    let path = format!("/v1/leases/{id}");
    let update = app.put(&path, json!({"end_date": "2030-01-01 13:00"}));
    let (updated, held_while_waiting) = tokio::join!(update, watch);
    assert_eq!(
        held_while_waiting, 0,
        "claims held while waiting for the kept host"
    );
    updated.assert_status(StatusCode::OK);
    assert_eq!(
        updated.body["lease"]["end_date"],
        "2030-01-01T13:00:00.000000"
    );
    other.close().await;
}

/// On PostgreSQL, a create that has claimed hosts of its own and still lacks some that
/// another writer has claimed does not wait for that writer (waiting while holding claims
/// closes circles): it takes them and lets the exclusion constraint decide. Here the other
/// writer holds three of four hosts' claims and allocates nothing: the create of all four
/// goes through while that writer is still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_holding_claims_does_not_wait_for_another_writers() {
    let Some((app, url)) = postgres_app().await else {
        return;
    };
    for i in 0..4 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let ids = host_ids(&app).await;
    assert_eq!(ids.len(), 4);

    let other = other_writer(url).await;
    let mut holder = other.write().await.unwrap();
    holder
        .claim_resources("physical:host", &ids[1..])
        .await
        .unwrap();

    let create = app.post(
        "/v1/leases",
        lease_body("all", "2030-01-01 10:00", "2030-01-01 12:00", 4, 4),
    );
    let created = tokio::time::timeout(std::time::Duration::from_secs(20), create).await;
    holder.commit().await.unwrap();
    let created = created.expect("the create waited for the other writer's claims");
    created.assert_status(StatusCode::CREATED);
    assert_eq!(hosts_held(&app, &created).await, 4);
    other.close().await;
}

/// On PostgreSQL, writers that find the head of the candidate order claimed by other
/// writers (who may well want other windows: a claim is on the resource) go on at a random
/// place of the rest instead of all walking past the same claims; without contention the
/// order is kept, so the first free host is the one a quiet create gets (and was offered).
#[tokio::test]
async fn creates_that_find_the_head_claimed_spread_over_the_rest() {
    let Some((app, url)) = postgres_app().await else {
        return;
    };
    for i in 0..48 {
        app.create_host(&format!("compute-{i:02}"), json!({})).await;
    }
    let ids = host_ids(&app).await;
    assert_eq!(ids.len(), 48);

    let other = other_writer(url).await;
    let mut holder = other.write().await.unwrap();
    holder
        .claim_resources("physical:host", &ids[..16])
        .await
        .unwrap();
    let mut got = Vec::new();
    for day in 1..=8 {
        let created = app
            .post(
                "/v1/leases",
                lease_body(
                    &format!("spread-{day}"),
                    &format!("2030-01-{day:02} 10:00"),
                    &format!("2030-01-{day:02} 12:00"),
                    1,
                    1,
                ),
            )
            .await;
        created.assert_status(StatusCode::CREATED);
        got.extend(hosts_of(&app, &created).await);
    }
    holder.rollback().await.unwrap();
    assert_eq!(got.len(), 8);
    assert!(
        got.iter().all(|id| !ids[..16].contains(id)),
        "a create took a host another writer had claimed: {got:?}"
    );
    // Every window is free on every host: walking on in order would give each the first
    // unclaimed host (the chance that eight random places all are that one is nil).
    assert!(
        got.iter().any(|id| *id != ids[16]),
        "every create walked to the first unclaimed host: {got:?}"
    );

    let quiet = app
        .post(
            "/v1/leases",
            lease_body("quiet", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1),
        )
        .await;
    quiet.assert_status(StatusCode::CREATED);
    assert_eq!(
        hosts_of(&app, &quiet).await,
        vec![ids[0]],
        "without contention the first host in order"
    );
    other.close().await;
}

/// On PostgreSQL, a create that holds nothing yet and finds the hosts it needs claimed by
/// another writer waits for that writer to end, then probes again: many writers racing
/// for one host must not all insert at once, where the database's exclusion checks can
/// wait for each other in circles that PostgreSQL breaks only after `deadlock_timeout`
/// (a 64-client race once took minutes and granted the host to nobody). Here the other
/// writer ends without allocating: the create then gets the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_holding_nothing_waits_for_the_claim_on_the_host_it_needs() {
    let Some((app, url)) = postgres_app().await else {
        return;
    };
    app.create_host("only", json!({})).await;
    let ids = host_ids(&app).await;

    let other = other_writer(url).await;
    let mut holder = other.write().await.unwrap();
    holder.claim_resources("physical:host", &ids).await.unwrap();

    let create = app.post(
        "/v1/leases",
        lease_body("one", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1),
    );
    tokio::pin!(create);
    let early = tokio::time::timeout(std::time::Duration::from_millis(700), &mut create).await;
    assert!(
        early.is_err(),
        "the create went ahead while another writer held the host's claim"
    );
    holder.rollback().await.unwrap();
    let created = tokio::time::timeout(std::time::Duration::from_secs(20), create)
        .await
        .expect("the create still waits after the claim was let go");
    created.assert_status(StatusCode::CREATED);
    assert_eq!(hosts_held(&app, &created).await, 1);
    other.close().await;
}

/// Many clients racing for the one host on PostgreSQL: one wins every round, and the
/// database never had to break a deadlock among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_for_one_host_never_deadlock() {
    let Some((app, url)) = postgres_app().await else {
        return;
    };
    app.create_host("only", json!({})).await;
    let deadlocks = async || -> i64 {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let n: i64 = sqlx::query_scalar(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        n
    };
    let before = deadlocks().await;
    for round in 0..8 {
        let start = format!("2030-01-{:02} 10:00", round + 1);
        let end = format!("2030-01-{:02} 11:00", round + 1);
        let responses = join_all((0..32).map(|i| {
            app.post(
                "/v1/leases",
                lease_body(&format!("race-{round}-{i}"), &start, &end, 1, 1),
            )
        }))
        .await;
        let statuses: Vec<StatusCode> = responses.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses
                .iter()
                .filter(|s| **s == StatusCode::CREATED)
                .count(),
            1,
            "round {round}: {statuses:?}"
        );
        assert!(
            statuses
                .iter()
                .all(|s| *s == StatusCode::CREATED || *s == StatusCode::CONFLICT),
            "round {round}: {statuses:?}"
        );
    }
    // The statistics collector reports a moment late.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert_eq!(deadlocks().await, before, "PostgreSQL broke deadlocks");
}

/// An app on PostgreSQL and its database URL; `None` on SQLite (the test has nothing to
/// show there: its writers are one at a time).
async fn postgres_app() -> Option<(TestApp, String)> {
    let db = crate::harness::TestDatabase::new().await;
    if !db.is_postgres() {
        return None;
    }
    let url = db.url.clone();
    Some((
        TestApp::spawn_on(db, blazar_service::Settings::default()).await,
        url,
    ))
}

/// The schema the test database runs in, which its connections name as their application.
fn schema_of(url: &str) -> String {
    url.rsplit("application_name=")
        .next()
        .expect("the test database names its schema")
        .to_string()
}

async fn host_ids(app: &TestApp) -> Vec<i64> {
    app.get("/v1/os-hosts").await.body["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

async fn other_writer(url: String) -> blazar_db::Store {
    blazar_db::Store::connect(&blazar_db::StoreOptions {
        url,
        max_connections: 2,
        ..blazar_db::StoreOptions::default()
    })
    .await
    .unwrap()
}

/// The ids of the hosts the created lease holds.
async fn hosts_of(app: &TestApp, created: &blazar_testkit::Response) -> Vec<i64> {
    let held = app
        .get(&format!(
            "/v1/os-hosts/allocations?lease_id={}",
            created.body["lease"]["id"].as_str().unwrap()
        ))
        .await;
    held.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| !a["reservations"].as_array().unwrap().is_empty())
        .map(|a| a["resource_id"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// How many hosts the created lease holds.
async fn hosts_held(app: &TestApp, created: &blazar_testkit::Response) -> usize {
    let held = app
        .get(&format!(
            "/v1/os-hosts/allocations?lease_id={}",
            created.body["lease"]["id"].as_str().unwrap()
        ))
        .await;
    held.body["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| !a["reservations"].as_array().unwrap().is_empty())
        .count()
}

/// On PostgreSQL a create of a project under quotas takes the project's turn before it
/// claims any resource, as an update of that project does: a create that claimed hosts
/// and then waited for the turn, held by an update waiting for one of those hosts, was a
/// circle PostgreSQL broke only after `deadlock_timeout` (requests of a minute and more
/// with two servers). Here another transaction holds the project's turn: the create waits
/// for it holding no claim, then goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_under_quotas_waits_for_its_projects_turn_holding_no_claim() {
    let Some((mut app, url)) = postgres_app().await else {
        return;
    };
    let schema = schema_of(&url);
    for i in 0..2 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    app.put("/v1/quotas/alpha", json!({"hosts": 2}))
        .await
        .assert_status(StatusCode::OK);
    app.act_as("alpha", "u1", "member");

    let other = other_writer(url.clone()).await;
    let mut holder = other.write().await.unwrap();
    holder.lock_project_usage("alpha").await.unwrap();

    let watch = async {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        let held_while_waiting = loop {
            let waiting: Option<(i32,)> = sqlx::query_as(
                "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1",
            )
            .bind(&schema)
            .fetch_optional(&mut conn)
            .await
            .unwrap();
            if let Some((pid,)) = waiting {
                let (held,): (i64,) = sqlx::query_as(
                    "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
                     AND pid = $1",
                )
                .bind(pid)
                .fetch_one(&mut conn)
                .await
                .unwrap();
                break held;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the create never waited for its project's turn"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        holder.commit().await.unwrap();
        held_while_waiting
    };
    let create = app.post(
        "/v1/leases",
        lease_body("quota", "2030-01-01 10:00", "2030-01-01 12:00", 1, 1),
    );
    let (created, held_while_waiting) = tokio::join!(create, watch);
    assert_eq!(
        held_while_waiting, 0,
        "advisory locks held while waiting for the project's turn"
    );
    created.assert_status(StatusCode::CREATED);
    other.close().await;
}
