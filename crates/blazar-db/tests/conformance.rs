//! The `Store` contract, checked directly through the public `Store`/`Tx` API on SQLite and,
//! when `BLAZAR_TEST_DATABASE_URL` is set, on PostgreSQL: migrations apply at connect, what
//! is written reads back, the database itself refuses overlapping allocations, lease
//! revisions move when a lease's children change, and an action goes to one claimant.

// Tests fail loudly on anything unexpected; that is what unwrap and expect are for here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use blazar_core::LeaseFilter;
use blazar_db::{
    ActionsSeen, Backend, DbError, DbResult, NewAllocation, RECONCILE_TASK, RepairItem, Store,
    StoreOptions, TaskClaim, TaskTerm, Tx,
};
use blazar_testkit::{TestDatabase, t};
use chrono::{DateTime, Duration, Utc};

/// The only place that knows the shapes of the row types: adapting the suite to a change of
/// them is a change here.
mod rows {
    use std::collections::BTreeMap;

    use blazar_core::{
        Event as EventRow, EventStatus, EventType, HostFacts, Lease as LeaseRow, LeaseStatus,
        Reservation as ReservationRow, ReservationSpec, ReservationStatus,
    };
    use blazar_db::{NewAction, NewAllocation, NewHost};
    use chrono::{DateTime, Utc};
    use serde_json::json;

    use super::created;

    pub fn lease(id: &str, start: DateTime<Utc>, end: DateTime<Utc>) -> LeaseRow {
        LeaseRow {
            id: id.into(),
            name: format!("lease-{id}"),
            user_id: "user".into(),
            project_id: "project".into(),
            trust_id: String::new(),
            keystone_trust: false,
            start,
            end,
            status: LeaseStatus::Pending,
            degraded: false,
            created_at: created(),
            updated_at: None,
        }
    }

    /// A lease of an hour from 10:00 on 1 January 2030, in `status`.
    pub fn lease_in(id: &str, status: LeaseStatus) -> LeaseRow {
        let start = created() + chrono::Duration::hours(26);
        LeaseRow {
            status,
            ..lease(id, start, start + chrono::Duration::hours(1))
        }
    }

    /// A `physical:host` reservation of `min..=max` hosts.
    pub fn host_reservation(id: &str, lease_id: &str, ordinal: i64, max: u32) -> ReservationRow {
        let stored = json!({"min": 1, "max": max, "hypervisor_properties": "",
                            "resource_properties": "", "before_end": "default"});
        ReservationRow {
            id: id.into(),
            lease_id: lease_id.into(),
            ordinal,
            resource_id: format!("resource-{id}"),
            status: ReservationStatus::Pending,
            missing_resources: false,
            resources_changed: false,
            spec: ReservationSpec::from_stored("physical:host", stored.as_object().unwrap())
                .unwrap(),
            granted_units: i64::from(max),
            created_at: created(),
            updated_at: None,
        }
    }

    pub fn event(id: &str, lease_id: &str, event_type: &str, time: DateTime<Utc>) -> EventRow {
        EventRow {
            id: id.into(),
            lease_id: lease_id.into(),
            event_type: event_type.parse::<EventType>().unwrap(),
            time,
            rank: if event_type == "end_lease" { 0 } else { 1 },
            status: EventStatus::Undone,
            created_at: created(),
            updated_at: None,
        }
    }

    /// Marks an event done.
    pub fn event_done(event: &mut EventRow, at: DateTime<Utc>) {
        event.status = EventStatus::Done;
        event.updated_at = Some(at);
    }

    /// Marks a reservation active.
    pub fn reservation_active(reservation: &mut ReservationRow, at: DateTime<Utc>) {
        reservation.status = ReservationStatus::Active;
        reservation.updated_at = Some(at);
    }

    pub fn host(name: &str, capabilities: &[(&str, &str)]) -> NewHost {
        NewHost {
            facts: HostFacts {
                hypervisor_hostname: name.into(),
                service_name: name.into(),
                hypervisor_type: "QEMU".into(),
                hypervisor_version: 2_011_001,
                vcpus: 16,
                memory_mb: 65_536,
                local_gb: 500,
                cpu_info: "{}".into(),
                availability_zone: "nova".into(),
            },
            trust_id: String::new(),
            capabilities: capabilities
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            created_at: created(),
        }
    }

    /// An exclusive allocation of host `resource_id` over `[start, end)`, blocked until
    /// `blocked_until`.
    pub fn allocation(
        reservation_id: &str,
        lease_id: &str,
        resource_id: i64,
        (start, end, blocked_until): (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>),
    ) -> NewAllocation {
        NewAllocation::whole(
            reservation_id,
            lease_id,
            "physical:host",
            resource_id,
            (start, end, blocked_until),
        )
    }

    /// The same window, shared (instance slots): shared allocations overlap each other.
    pub fn shared(mut allocation: NewAllocation) -> NewAllocation {
        allocation.occupancy.exclusive = false;
        allocation.occupancy.units = 2;
        allocation.occupancy.vcpus = 1;
        allocation.occupancy.memory_mb = 1_024;
        allocation.occupancy.disk_gb = 10;
        allocation
    }

    pub fn action(lease_id: &str, reservation_id: &str, resources: &[i64]) -> NewAction {
        NewAction {
            intent: blazar_core::ActionIntent {
                lease_id: lease_id.into(),
                reservation_id: reservation_id.into(),
                project_id: "project".into(),
                kind: blazar_core::ActionKind::Start,
                purpose: blazar_core::ActionPurpose::LeaseStart,
                resource_type: "physical:host".into(),
                payload: "{}".into(),
                request_id: None,
            },
            resources: resources.to_vec(),
            created_at: created(),
        }
    }
}

/// When every row of these tests was written.
fn created() -> DateTime<Utc> {
    t(2029, 12, 31, 8, 0)
}

async fn connect(db: &TestDatabase) -> Store {
    Store::connect(&StoreOptions {
        url: db.url.clone(),
        max_connections: 4,
        ..StoreOptions::default()
    })
    .await
    .expect("connect")
}

/// Runs `write` in a write transaction and commits it; the error of either, if any. On
/// SQLite writes are queued until the next read or the commit, so a refusal may surface at
/// either.
async fn in_write<F>(store: &Store, write: F) -> DbResult<()>
where
    F: AsyncFnOnce(&mut Tx) -> DbResult<()>,
{
    let mut tx = store.write().await?;
    write(&mut tx).await?;
    tx.commit().await
}

/// A lease from 10:00 to 12:00 on 1 January 2030 with one host reservation, committed.
async fn seed_lease(store: &Store, lease: &str) -> String {
    let reservation = format!("{lease}-r0");
    in_write(store, async |tx| {
        tx.insert_lease(&rows::lease(
            lease,
            t(2030, 1, 1, 10, 0),
            t(2030, 1, 1, 12, 0),
        ))
        .await?;
        tx.insert_reservation(&rows::host_reservation(&reservation, lease, 0, 1))
            .await
    })
    .await
    .unwrap();
    reservation
}

async fn revision(store: &Store, lease: &str) -> i64 {
    let mut tx = store.read().await.unwrap();
    let revisions = tx
        .lease_revisions(&LeaseFilter {
            id: Some(lease.into()),
            ..LeaseFilter::default()
        })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(revisions.len(), 1, "{revisions:?}");
    revisions[0].1
}

#[tokio::test]
async fn migrations_apply_at_connect_and_again_on_a_migrated_database() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let expected = if db.is_postgres() {
        Backend::Postgres
    } else {
        Backend::Sqlite
    };
    assert_eq!(store.backend(), expected);
    // Every table the contract reads exists, empty.
    let mut tx = store.read().await.unwrap();
    assert!(tx.list_hosts().await.unwrap().is_empty());
    assert!(
        tx.lease_trees(&LeaseFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        tx.list_actions(&blazar_core::ActionFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .is_empty()
    );
    assert_eq!(tx.inventory_version("physical:host").await.unwrap(), 0);
    assert_eq!(tx.next_event_time().await.unwrap(), None);
    tx.commit().await.unwrap();
    seed_lease(&store, "l1").await;
    store.close().await;

    // A second connect finds the migrations applied and the data in place.
    let again = connect(&db).await;
    let mut tx = again.read().await.unwrap();
    assert_eq!(
        tx.lease_trees(&LeaseFilter::default()).await.unwrap().len(),
        1
    );
    tx.commit().await.unwrap();
    again.close().await;
}

#[tokio::test]
async fn hosts_read_back_with_their_capabilities() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let new = rows::host("compute-1", &[("gpu", "true"), ("rack", "r1")]);
    let mut tx = store.write().await.unwrap();
    let before = tx.inventory_version("physical:host").await.unwrap();
    let id = tx.insert_host(&new).await.unwrap();
    let second = tx.insert_host(&rows::host("compute-2", &[])).await.unwrap();
    tx.commit().await.unwrap();
    assert!(second > id);

    let mut tx = store.read().await.unwrap();
    let host = tx.get_host(id).await.unwrap().expect("host");
    assert_eq!(host.id, id);
    assert_eq!(host.facts, new.facts);
    assert_eq!(host.capabilities, new.capabilities);
    assert!(host.reservable);
    assert_eq!(host.created_at, created());
    assert_eq!(host.updated_at, None);
    let listed: Vec<i64> = tx
        .list_hosts()
        .await
        .unwrap()
        .iter()
        .map(|h| h.id)
        .collect();
    assert_eq!(listed, vec![id, second]);
    assert!(tx.get_host(second + 1).await.unwrap().is_none());
    // Every host change moves the inventory version.
    assert!(tx.inventory_version("physical:host").await.unwrap() > before);
    tx.commit().await.unwrap();
    store.close().await;
}

#[tokio::test]
async fn leases_read_back_with_their_reservations_and_events() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let (start, end) = (t(2030, 1, 1, 10, 0), t(2030, 1, 1, 12, 0));
    let lease = rows::lease("l1", start, end);
    // Written out of order: reads give reservations by ordinal and events by time.
    let reservations = [
        rows::host_reservation("r1", "l1", 1, 2),
        rows::host_reservation("r0", "l1", 0, 1),
    ];
    let events = [
        rows::event("e-end", "l1", "end_lease", end),
        rows::event("e-start", "l1", "start_lease", start),
    ];
    in_write(&store, async |tx| {
        tx.insert_lease(&lease).await?;
        for r in &reservations {
            tx.insert_reservation(r).await?;
        }
        for e in &events {
            tx.insert_event(e).await?;
        }
        Ok(())
    })
    .await
    .unwrap();
    // Another project's lease, for the filters.
    // It acts through a Keystone trust: the flag reads back both ways.
    let mut other = rows::lease("l2", start, end);
    other.project_id = "other".into();
    other.trust_id = "0123456789abcdef0123456789abcdef".into();
    other.keystone_trust = true;
    in_write(&store, async |tx| tx.insert_lease(&other).await)
        .await
        .unwrap();

    let mut tx = store.read().await.unwrap();
    assert_eq!(tx.get_lease("l1").await.unwrap(), Some(lease.clone()));
    assert_eq!(tx.get_lease("nope").await.unwrap(), None);
    let by_ordinal = vec![reservations[1].clone(), reservations[0].clone()];
    let by_time = vec![events[1].clone(), events[0].clone()];
    assert_eq!(tx.reservations_of("l1").await.unwrap(), by_ordinal);
    assert_eq!(tx.events_of("l1").await.unwrap(), by_time);
    assert_eq!(
        tx.get_reservation("r1").await.unwrap(),
        Some(reservations[0].clone())
    );
    // The tree read gives the same rows.
    let mine = LeaseFilter {
        project_id: Some("project".into()),
        ..LeaseFilter::default()
    };
    let trees = tx.lease_trees(&mine).await.unwrap();
    assert_eq!(trees, vec![(lease.clone(), by_ordinal, by_time)]);
    assert_eq!(
        tx.lease_trees(&LeaseFilter::default()).await.unwrap().len(),
        2
    );
    assert_eq!(tx.get_lease("l2").await.unwrap(), Some(other.clone()));
    let theirs = LeaseFilter {
        project_id: Some("other".into()),
        ..LeaseFilter::default()
    };
    assert_eq!(tx.lease_trees(&theirs).await.unwrap()[0].0, other);
    tx.commit().await.unwrap();

    // A delete takes the children with it.
    in_write(&store, async |tx| tx.delete_lease("l1").await)
        .await
        .unwrap();
    let mut tx = store.read().await.unwrap();
    assert_eq!(tx.get_lease("l1").await.unwrap(), None);
    assert!(tx.reservations_of("l1").await.unwrap().is_empty());
    assert!(tx.events_of("l1").await.unwrap().is_empty());
    tx.commit().await.unwrap();
    store.close().await;
}

#[tokio::test]
async fn allocations_read_back() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let reservation = seed_lease(&store, "l1").await;
    let window = (
        t(2030, 1, 1, 10, 0),
        t(2030, 1, 1, 12, 0),
        t(2030, 1, 1, 12, 30),
    );
    let new = vec![
        rows::allocation(&reservation, "l1", 7, window),
        rows::allocation(&reservation, "l1", 3, window),
    ];
    let mut tx = store.write().await.unwrap();
    let ids = tx.insert_allocations(&new).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ids.len(), 2);

    let mut tx = store.read().await.unwrap();
    let read = tx.allocations_of_lease("l1").await.unwrap();
    tx.commit().await.unwrap();
    // By resource id, each as written, with the id the insert returned.
    let resources: Vec<i64> = read.iter().map(|a| a.resource_id).collect();
    assert_eq!(resources, vec![3, 7]);
    for (row, (id, written)) in read.iter().rev().zip(ids.iter().zip(&new)) {
        assert_eq!(&row.id, id);
        assert_eq!(
            (
                &row.reservation_id,
                &row.lease_id,
                &row.resource_type,
                row.resource_id
            ),
            (
                &written.reservation_id,
                &written.lease_id,
                &written.resource_type,
                written.resource_id
            )
        );
        assert_eq!(
            (
                row.occupancy.start,
                row.occupancy.end,
                row.occupancy.blocked_until
            ),
            (
                written.occupancy.start,
                written.occupancy.end,
                written.occupancy.blocked_until
            )
        );
        assert_eq!(
            (
                row.occupancy.exclusive,
                row.occupancy.units,
                row.occupancy.vcpus
            ),
            (
                written.occupancy.exclusive,
                written.occupancy.units,
                written.occupancy.vcpus
            )
        );
    }
    store.close().await;
}

/// Inserts `allocation` in a transaction of its own.
async fn allocate(store: &Store, allocation: NewAllocation) -> DbResult<()> {
    in_write(store, async |tx| {
        tx.insert_allocations(&[allocation]).await.map(|_| ())
    })
    .await
}

#[tokio::test]
async fn the_database_refuses_overlapping_allocations_of_one_resource() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let first = seed_lease(&store, "l1").await;
    let second = seed_lease(&store, "l2").await;
    let at = |h: u32, m: u32| t(2030, 1, 1, h, m);
    allocate(
        &store,
        rows::allocation(&first, "l1", 1, (at(10, 0), at(12, 0), at(12, 30))),
    )
    .await
    .unwrap();

    // Overlapping the allocation, or only its cleaning margin: refused.
    for window in [
        (at(11, 0), at(13, 0), at(13, 0)),
        (at(9, 0), at(10, 1), at(10, 1)),
        (at(10, 30), at(11, 0), at(11, 0)),
        (at(12, 15), at(14, 0), at(14, 0)),
        (at(8, 0), at(16, 0), at(16, 0)),
    ] {
        let refused = allocate(&store, rows::allocation(&second, "l2", 1, window)).await;
        assert!(
            matches!(refused, Err(DbError::Overlap)),
            "{window:?}: {refused:?}"
        );
    }
    // Two overlapping allocations in one statement: refused too, and nothing is written.
    let both = [
        rows::allocation(&second, "l2", 2, (at(10, 0), at(11, 0), at(11, 0))),
        rows::allocation(&second, "l2", 2, (at(10, 30), at(11, 30), at(11, 30))),
    ];
    let refused = in_write(&store, async |tx| {
        tx.insert_allocations(&both).await.map(|_| ())
    })
    .await;
    assert!(matches!(refused, Err(DbError::Overlap)), "{refused:?}");

    // Half-open windows: one that starts where the other is no longer blocked is accepted,
    // before and after; so are other resources, and other types of the same id.
    allocate(
        &store,
        rows::allocation(&second, "l2", 1, (at(12, 30), at(14, 0), at(14, 0))),
    )
    .await
    .unwrap();
    allocate(
        &store,
        rows::allocation(&second, "l2", 1, (at(8, 0), at(10, 0), at(10, 0))),
    )
    .await
    .unwrap();
    allocate(
        &store,
        rows::allocation(&second, "l2", 2, (at(10, 0), at(12, 0), at(12, 0))),
    )
    .await
    .unwrap();
    let mut other_type = rows::allocation(&second, "l2", 1, (at(10, 0), at(12, 0), at(12, 0)));
    other_type.resource_type = "virtual:floatingip".into();
    allocate(&store, other_type).await.unwrap();

    // Shared allocations overlap each other, never an exclusive one.
    let shared = |start, end| rows::shared(rows::allocation(&second, "l2", 5, (start, end, end)));
    allocate(&store, shared(at(10, 0), at(12, 0)))
        .await
        .unwrap();
    allocate(&store, shared(at(11, 0), at(13, 0)))
        .await
        .unwrap();
    let refused = allocate(
        &store,
        rows::allocation(&first, "l1", 5, (at(11, 30), at(11, 45), at(11, 45))),
    )
    .await;
    assert!(matches!(refused, Err(DbError::Overlap)), "{refused:?}");

    let mut tx = store.read().await.unwrap();
    let held = |rows: Vec<blazar_core::Allocation>| {
        let mut v: Vec<(i64, DateTime<Utc>)> = rows
            .iter()
            .filter(|a| a.resource_type == "physical:host")
            .map(|a| (a.resource_id, a.occupancy.start))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        held(tx.allocations_of_lease("l1").await.unwrap()),
        vec![(1, at(10, 0))]
    );
    assert_eq!(
        held(tx.allocations_of_lease("l2").await.unwrap()),
        vec![
            (1, at(8, 0)),
            (1, at(12, 30)),
            (2, at(10, 0)),
            (5, at(10, 0)),
            (5, at(11, 0))
        ]
    );
    tx.commit().await.unwrap();
    store.close().await;
}

#[tokio::test]
async fn revisions_move_when_a_lease_or_its_children_change() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let (start, end) = (t(2030, 1, 1, 10, 0), t(2030, 1, 1, 12, 0));
    let reservation = seed_lease(&store, "l1").await;
    seed_lease(&store, "l2").await;
    let mut event = rows::event("e1", "l1", "start_lease", start);
    let mut last = revision(&store, "l1").await;
    let other = revision(&store, "l2").await;

    let moved = async |what: &str, last: &mut i64| {
        let now = revision(&store, "l1").await;
        assert!(now > *last, "{what}: {now} after {last}");
        *last = now;
    };
    in_write(&store, async |tx| tx.insert_event(&event).await)
        .await
        .unwrap();
    moved("an event added", &mut last).await;
    rows::event_done(&mut event, start);
    in_write(&store, async |tx| tx.update_event(&event).await)
        .await
        .unwrap();
    moved("an event changed", &mut last).await;
    let mut tx = store.read().await.unwrap();
    let mut r = tx.get_reservation(&reservation).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    rows::reservation_active(&mut r, start);
    in_write(&store, async |tx| tx.update_reservation(&r).await)
        .await
        .unwrap();
    moved("a reservation changed", &mut last).await;
    in_write(&store, async |tx| {
        tx.insert_reservation(&rows::host_reservation("l1-r1", "l1", 1, 1))
            .await
    })
    .await
    .unwrap();
    moved("a reservation added", &mut last).await;
    let mut lease = rows::lease("l1", start, end + Duration::hours(1));
    lease.updated_at = Some(start);
    in_write(&store, async |tx| {
        tx.update_lease(&lease).await?;
        tx.insert_event(&rows::event("e2", "l1", "end_lease", lease.end))
            .await
    })
    .await
    .unwrap();
    moved("the lease and an event changed together", &mut last).await;

    // Reading, or a transaction that is rolled back, moves nothing; nor does the other
    // lease move with this one.
    let mut tx = store.read().await.unwrap();
    tx.lease_trees(&LeaseFilter::default()).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    tx.insert_event(&rows::event("e3", "l1", "before_end_lease", start))
        .await
        .unwrap();
    drop(tx);
    assert_eq!(revision(&store, "l1").await, last);
    assert_eq!(revision(&store, "l2").await, other);
    store.close().await;
}

#[tokio::test]
async fn an_action_goes_to_one_claimant() {
    let db = TestDatabase::new().await;
    // Two stores, as two replicas of the server have.
    let (one, two) = (connect(&db).await, connect(&db).await);
    let reservation = seed_lease(&one, "l1").await;
    let mut tx = one.write().await.unwrap();
    let seq = tx
        .insert_action(&rows::action("l1", &reservation, &[1, 2]))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let now = created() + Duration::minutes(1);
    let claim_for = Duration::minutes(5);

    // Both claim at once; the first holds its transaction open a moment.
    let claim = async |store: &Store, worker: &str, hold: bool| {
        let mut tx = store.write().await.unwrap();
        let claimed = tx.claim_actions(now, worker, claim_for, 10).await.unwrap();
        if hold {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        tx.commit().await.unwrap();
        claimed
    };
    let (a, b) = tokio::join!(claim(&one, "w1", true), claim(&two, "w2", false));
    let winners: Vec<(&str, i64)> = a
        .iter()
        .map(|r| ("w1", r.seq))
        .chain(b.iter().map(|r| ("w2", r.seq)))
        .collect();
    assert_eq!(winners.len(), 1, "{winners:?}");
    let (winner, loser) = match winners[0] {
        ("w1", _) => ("w1", "w2"),
        _ => ("w2", "w1"),
    };
    assert_eq!(winners[0].1, seq);
    let claimed = a.into_iter().chain(b).next().unwrap();
    assert_eq!(claimed.status, blazar_core::ActionStatus::Running);
    assert_eq!(claimed.claimed_by.as_deref(), Some(winner));
    assert_eq!(claimed.attempts, 1);

    // While the claim holds nobody else gets it; once it expires, another worker does, and
    // the first worker's outcome no longer counts.
    let mut tx = two.write().await.unwrap();
    assert!(
        tx.claim_actions(now + Duration::minutes(4), loser, claim_for, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let later = now + claim_for + Duration::minutes(1);
    let again = tx.claim_action(seq, later, loser, claim_for).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again.map(|r| (r.seq, r.attempts)), Some((seq, 2)));
    let mut tx = one.write().await.unwrap();
    let done = blazar_db::ActionOutcome::Done;
    assert!(!tx.finish_action(seq, winner, &done, later).await.unwrap());
    assert!(tx.finish_action(seq, loser, &done, later).await.unwrap());
    // Done, it is never claimed again.
    assert!(
        tx.claim_actions(later + Duration::hours(1), winner, claim_for, 10)
            .await
            .unwrap()
            .is_empty()
    );
    tx.commit().await.unwrap();
    let mut tx = one.read().await.unwrap();
    let row = tx.get_action(seq).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    assert_eq!(row.status, blazar_core::ActionStatus::Done);
    assert_eq!(row.claimed_by, None);
    one.close().await;
    two.close().await;
}

/// Reads near a window find an allocation that started long before it: the longest span
/// of a type is kept (grown by a longer allocation, never shrunk by a shorter one), and
/// reads look back that far.
#[tokio::test]
async fn a_long_allocation_is_found_far_from_its_start_after_shorter_ones() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let reservation = seed_lease(&store, "l1").await;
    let day = |d: u32, h: u32| t(2030, 1, d, h, 0);
    for (host, window) in [
        (1, (day(1, 10), day(1, 12), day(1, 12))),
        // Twenty days long: the longest span grows.
        (2, (day(2, 0), day(22, 0), day(22, 0))),
        (3, (day(3, 10), day(3, 11), day(3, 11))),
    ] {
        allocate(&store, rows::allocation(&reservation, "l1", host, window))
            .await
            .unwrap();
    }
    let mut tx = store.read().await.unwrap();
    let busy = tx
        .busy_among("physical:host", &[1, 2, 3], day(20, 0), day(20, 1))
        .await
        .unwrap();
    assert_eq!(busy.into_iter().collect::<Vec<_>>(), vec![2]);
    let usage = tx
        .usage_among("physical:host", &[1, 2, 3], day(21, 0), day(21, 1), None)
        .await
        .unwrap();
    assert_eq!(
        usage.iter().map(|u| u.resource_id).collect::<Vec<_>>(),
        vec![2]
    );
    tx.commit().await.unwrap();
    store.close().await;
}

/// Leases are counted per status, the ended ones as the rest of all of them (they are not
/// in the index the others are counted from).
#[tokio::test]
async fn leases_are_counted_per_status() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let counts = |store: &Store| {
        let store = store.clone();
        async move {
            let mut tx = store.read().await.unwrap();
            let mut counts = tx.lease_status_counts().await.unwrap();
            tx.commit().await.unwrap();
            counts.sort();
            counts
        }
    };
    assert_eq!(counts(&store).await, vec![]);
    use blazar_core::LeaseStatus::{Active, Error, Pending, Terminated};
    let statuses = [
        ("a", Terminated),
        ("b", Active),
        ("c", Terminated),
        ("d", Pending),
        ("e", Terminated),
        ("f", Error),
    ];
    in_write(&store, async |tx| {
        for (id, status) in statuses {
            tx.insert_lease(&rows::lease_in(id, status)).await?;
        }
        Ok(())
    })
    .await
    .unwrap();
    let expected: Vec<(String, i64)> = [
        ("ACTIVE", 1),
        ("ERROR", 1),
        ("PENDING", 1),
        ("TERMINATED", 3),
    ]
    .iter()
    .map(|(s, n)| (s.to_string(), *n))
    .collect();
    assert_eq!(counts(&store).await, expected);
    store.close().await;
}

/// Who holds each resource of a pool now is one read: the lease covering `now` (its
/// project), not one that ended (even while its resource is still blocked) nor one to come.
#[tokio::test]
async fn the_projects_holding_a_pool_now_are_read_at_once() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let hour = |h: u32| t(2030, 1, 1, h, 0);
    let mut other = rows::lease("l2", hour(8), hour(10));
    other.project_id = "other".into();
    in_write(&store, async |tx| {
        tx.insert_lease(&other).await?;
        tx.insert_reservation(&rows::host_reservation("l2-r0", "l2", 0, 3))
            .await
    })
    .await
    .unwrap();
    let reservation = seed_lease(&store, "l1").await;
    for (lease, reservation, host, window) in [
        // Resource 1 passes from l2 (blocked until 10:30) to l1 at 11:00.
        ("l2", "l2-r0", 1, (hour(8), hour(10), t(2030, 1, 1, 10, 30))),
        (
            "l1",
            reservation.as_str(),
            1,
            (hour(11), hour(12), hour(12)),
        ),
        // Resource 2 is l2's alone; resource 3 is l1's.
        ("l2", "l2-r0", 2, (hour(8), hour(10), hour(10))),
        (
            "l1",
            reservation.as_str(),
            3,
            (hour(10), hour(12), hour(12)),
        ),
    ] {
        allocate(&store, rows::allocation(reservation, lease, host, window))
            .await
            .unwrap();
    }
    let mut tx = store.read().await.unwrap();
    let at = |h: u32, m: u32| t(2030, 1, 1, h, m);
    let mut seen = Vec::new();
    for now in [at(9, 0), at(10, 15), at(11, 0), at(12, 0)] {
        let mut holding: Vec<(i64, String)> = tx
            .projects_holding_now("physical:host", now)
            .await
            .unwrap()
            .into_iter()
            .collect();
        holding.sort();
        seen.push(holding);
    }
    tx.commit().await.unwrap();
    let held = |pairs: &[(i64, &str)]| -> Vec<(i64, String)> {
        pairs.iter().map(|(id, p)| (*id, p.to_string())).collect()
    };
    assert_eq!(
        seen,
        vec![
            held(&[(1, "other"), (2, "other")]),
            held(&[(3, "project")]),
            held(&[(1, "project"), (3, "project")]),
            held(&[]),
        ]
    );
    store.close().await;
}

/// A window read by time at once finds what reading it by resource finds, a lease far
/// longer than the rest included (its allocation began long before the window), and gives
/// the read back to batches when the window holds more than asked for, or when the filter
/// is not a window on both sides.
#[tokio::test]
async fn a_window_read_by_time_finds_what_batches_find_or_gives_way_to_them() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let day = |d: u32, h: u32| t(2030, 1, d, h, 0);
    let mut leases = vec![("long", day(2, 0), day(22, 0), vec![2])];
    for k in 0..3 {
        leases.push((
            "short",
            day(20, 10 + k),
            day(20, 11 + k),
            vec![10 + i64::from(k)],
        ));
    }
    leases.push(("later", day(25, 10), day(25, 11), vec![2, 10]));
    leases.push(("earlier", day(1, 10), day(1, 11), vec![3]));
    for (n, (name, start, end, hosts)) in leases.iter().enumerate() {
        let lease = format!("{name}-{n}");
        let reservation = format!("{lease}-r0");
        in_write(&store, async |tx| {
            tx.insert_lease(&rows::lease(&lease, *start, *end)).await?;
            tx.insert_reservation(&rows::host_reservation(&reservation, &lease, 0, 3))
                .await?;
            let allocations: Vec<NewAllocation> = hosts
                .iter()
                .map(|h| rows::allocation(&reservation, &lease, *h, (*start, *end, *end)))
                .collect();
            tx.insert_allocations(&allocations).await.map(|_| ())
        })
        .await
        .unwrap();
    }
    let window = blazar_db::AllocationFilter {
        ends_after: Some(day(20, 0)),
        starts_before: Some(day(21, 0)),
        ..blazar_db::AllocationFilter::default()
    };
    let mut tx = store.read().await.unwrap();
    let by_resource = tx
        .allocation_views_where("physical:host", &window)
        .await
        .unwrap();
    let held: Vec<(i64, &str)> = by_resource
        .iter()
        .map(|v| (v.resource_id, &*v.lease_id))
        .collect();
    assert_eq!(
        held,
        vec![
            (2, "long-0"),
            (10, "short-1"),
            (11, "short-2"),
            (12, "short-3")
        ]
    );
    let by_time = tx
        .allocation_views_in_window("physical:host", &window, 4)
        .await
        .unwrap();
    assert_eq!(by_time.as_ref(), Some(&by_resource));
    assert_eq!(
        tx.allocation_views_in_window("physical:host", &window, 3)
            .await
            .unwrap(),
        None,
        "more than asked for: read by resource"
    );
    for not_a_window in [
        blazar_db::AllocationFilter {
            starts_before: None,
            ..window.clone()
        },
        blazar_db::AllocationFilter {
            resources: Some((2, 10)),
            ..window.clone()
        },
        blazar_db::AllocationFilter {
            lease_id: Some("long-0".into()),
            ..window.clone()
        },
    ] {
        assert_eq!(
            tx.allocation_views_in_window("physical:host", &not_a_window, 100)
                .await
                .unwrap(),
            None,
            "{not_a_window:?}"
        );
    }
    tx.commit().await.unwrap();
    store.close().await;
}

/// The longest span a process remembers (to skip the write of spans no longer) is one
/// that committed: a long allocation rolled back leaves nothing remembered, and the same
/// span written again afterwards is stored, so reads still look back that far.
#[tokio::test]
async fn a_rolled_back_long_allocation_does_not_excuse_the_next_from_recording_its_span() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let reservation = seed_lease(&store, "l1").await;
    let day = |d: u32, h: u32| t(2030, 1, d, h, 0);
    allocate(
        &store,
        rows::allocation(&reservation, "l1", 1, (day(1, 10), day(1, 12), day(1, 12))),
    )
    .await
    .unwrap();
    let twenty_days = (day(2, 0), day(22, 0), day(22, 0));
    let mut tx = store.write().await.unwrap();
    tx.insert_allocations(&[rows::allocation(&reservation, "l1", 2, twenty_days)])
        .await
        .unwrap();
    // Sent (SQLite queues writes until a read), then undone.
    tx.busy_among("physical:host", &[2], day(20, 0), day(20, 1))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    allocate(&store, rows::allocation(&reservation, "l1", 3, twenty_days))
        .await
        .unwrap();
    // A shorter one after it is not a reason to forget it either.
    allocate(
        &store,
        rows::allocation(&reservation, "l1", 4, (day(3, 10), day(3, 11), day(3, 11))),
    )
    .await
    .unwrap();
    let mut tx = store.read().await.unwrap();
    let busy = tx
        .busy_among("physical:host", &[1, 2, 3, 4], day(20, 0), day(20, 1))
        .await
        .unwrap();
    assert_eq!(busy.into_iter().collect::<Vec<_>>(), vec![3]);
    tx.commit().await.unwrap();
    store.close().await;
}

/// Places in the notification outbox are final once readable: a notification whose
/// transaction commits after a later-written one's is placed after it, so a reader that
/// resumes after the last place it read misses nothing. (PostgreSQL runs the two writers
/// side by side; SQLite's one writer orders them at commit.)
#[tokio::test]
async fn a_notification_committed_late_is_placed_after_those_read_before_it() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let note = |id: &str| blazar_core::Notification {
        id: id.into(),
        event_type: "lease.create".into(),
        lease_id: Some(format!("lease-{id}")),
        payload: serde_json::json!({"project_id": "project"}),
        created_at: created(),
        request_id: Some(format!("req-{id}")),
    };
    let read_after = async |after: i64| -> Vec<(i64, String)> {
        in_write(&store, async |tx| {
            tx.sequence_notifications().await.map(drop)
        })
        .await
        .unwrap();
        let mut tx = store.read().await.unwrap();
        let rows = tx.notifications_after(after, 100).await.unwrap();
        tx.commit().await.unwrap();
        rows.into_iter()
            .map(|r| (r.seq, r.notification.id))
            .collect()
    };
    let ids = |rows: &[(i64, String)]| rows.iter().map(|r| r.1.clone()).collect::<Vec<_>>();

    let first = if store.backend() == Backend::Postgres {
        // `early` is written first and commits last.
        let mut early = store.write().await.unwrap();
        early.insert_notification(&note("early")).await.unwrap();
        in_write(&store, async |tx| {
            tx.insert_notification(&note("late")).await
        })
        .await
        .unwrap();
        let first = read_after(0).await;
        assert_eq!(ids(&first), ["late"]);
        early.commit().await.unwrap();
        first
    } else {
        in_write(&store, async |tx| {
            tx.insert_notification(&note("late")).await
        })
        .await
        .unwrap();
        let first = read_after(0).await;
        in_write(&store, async |tx| {
            tx.insert_notification(&note("early")).await
        })
        .await
        .unwrap();
        first
    };
    let after = read_after(first[0].0).await;
    assert_eq!(ids(&after), ["early"]);
    assert!(after[0].0 > first[0].0, "{first:?} {after:?}");
    // Read from the start, each once, in the order of their places.
    assert_eq!(ids(&read_after(0).await), ["late", "early"]);
    // Nothing is left to place, and placing again changes nothing.
    let mut tx = store.write().await.unwrap();
    assert_eq!(tx.sequence_notifications().await.unwrap(), 0);
    tx.commit().await.unwrap();
    store.close().await;
}

/// Two installations in two schemas of one PostgreSQL database (the suite's schema per test
/// is one such case) hold their locks apart: advisory locks belong to the database, and
/// without a namespace per schema one's scheduler lock would stop the other's scheduler, and
/// one's claim on its host 2 would hide the other's host 2 from a search. Within one schema
/// the locks still exclude.
#[tokio::test]
async fn locks_of_two_schemas_of_one_database_are_apart() {
    let Some(base) = blazar_testkit::postgres_url() else {
        return;
    };
    let (one_db, other_db) = (
        TestDatabase::postgres(base.clone()).await,
        TestDatabase::postgres(base).await,
    );
    let (one, other) = (connect(&one_db).await, connect(&other_db).await);
    let wait = std::time::Duration::from_secs(5);

    let mut held = one.write().await.unwrap();
    held.lock_scheduler().await.unwrap();
    held.lock_allocations().await.unwrap();
    let (claimed, contended) = held.try_claim_resources("host", &[1, 2], 2).await.unwrap();
    assert_eq!((claimed, contended), (vec![1, 2], vec![]));

    // The other schema: nothing of the above is in its way.
    let mut apart = other.write().await.unwrap();
    tokio::time::timeout(wait, apart.lock_scheduler())
        .await
        .expect("the other schema's scheduler lock is free")
        .unwrap();
    tokio::time::timeout(wait, apart.lock_allocations())
        .await
        .expect("the other schema's allocation lock is free")
        .unwrap();
    let (claimed, contended) = apart.try_claim_resources("host", &[2, 3], 2).await.unwrap();
    assert_eq!(
        (claimed, contended),
        (vec![2, 3], vec![]),
        "the other schema's hosts"
    );
    apart.rollback().await.unwrap();

    // The same schema: the claims and the locks are taken.
    let mut same = one.write().await.unwrap();
    let (claimed, contended) = same.try_claim_resources("host", &[2, 3], 2).await.unwrap();
    assert_eq!(
        (claimed, contended),
        (vec![3], vec![2]),
        "one schema's claims exclude"
    );
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), same.lock_scheduler())
            .await
            .is_err(),
        "one schema's scheduler lock excludes"
    );
    drop(same);
    held.rollback().await.unwrap();
}

/// A transaction's choice from an inventory goes stale when a resource changes or goes
/// (capacity, properties, `reservable`, a delete: the count of changes moves), not when one
/// is registered (only the version moves: caches must see the new resource). PostgreSQL
/// only: a SQLite writer holds the only write lock, so nothing else can change meanwhile.
#[tokio::test]
async fn a_new_resource_leaves_a_choice_made_from_an_inventory_standing() {
    use blazar_core::PHYSICAL_HOST;
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    if store.backend() != Backend::Postgres {
        return;
    }
    let mut tx = store.write().await.unwrap();
    let first = tx.insert_host(&rows::host("compute-1", &[])).await.unwrap();
    tx.commit().await.unwrap();

    let mut chooser = store.write().await.unwrap();
    let before = chooser.inventory_version(PHYSICAL_HOST).await.unwrap();
    in_write(&store, async |tx| {
        tx.insert_host(&rows::host("compute-2", &[("rack", "r1")]))
            .await
            .map(|_| ())
    })
    .await
    .unwrap();
    assert!(chooser.inventory_unchanged(PHYSICAL_HOST).await.unwrap());
    let mut reader = store.read().await.unwrap();
    assert!(
        reader.inventory_version(PHYSICAL_HOST).await.unwrap() > before,
        "the version moves for caches"
    );
    reader.commit().await.unwrap();
    in_write(&store, async |tx| {
        tx.set_capability(PHYSICAL_HOST, first, "rack", "r2", created())
            .await
    })
    .await
    .unwrap();
    assert!(!chooser.inventory_unchanged(PHYSICAL_HOST).await.unwrap());
    chooser.rollback().await.unwrap();
}

/// `try_lock_lease` never waits: another transaction's lease is `None` on PostgreSQL, one
/// the transaction holds itself comes back, a missing one is `None`.
#[tokio::test]
async fn a_lease_lock_that_must_not_wait_passes_over_a_held_lease() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    seed_lease(&store, "l1").await;
    seed_lease(&store, "l2").await;
    let mut first = store.write().await.unwrap();
    assert_eq!(first.lock_lease("l1").await.unwrap().unwrap().id, "l1");
    assert_eq!(first.try_lock_lease("l1").await.unwrap().unwrap().id, "l1");
    assert!(first.try_lock_lease("nope").await.unwrap().is_none());
    if store.backend() != Backend::Postgres {
        // One writer at a time: nobody else can hold a lease.
        first.rollback().await.unwrap();
        return;
    }
    let mut second = store.write().await.unwrap();
    let wait = std::time::Duration::from_secs(5);
    let held = tokio::time::timeout(wait, second.try_lock_lease("l1"))
        .await
        .expect("does not wait")
        .unwrap();
    assert!(held.is_none(), "another transaction holds l1");
    assert_eq!(second.try_lock_lease("l2").await.unwrap().unwrap().id, "l2");
    first.rollback().await.unwrap();
    assert_eq!(second.try_lock_lease("l1").await.unwrap().unwrap().id, "l1");
    second.rollback().await.unwrap();
}

/// A claim walks the candidates in the order given, passes over those another transaction
/// holds, and stops at as many as are wanted: the candidates after the last one it took are
/// left for others (on PostgreSQL; SQLite's serialised writers take the first ones).
#[tokio::test]
async fn a_claim_passes_over_others_claims_and_stops_at_what_it_wants() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let postgres = store.backend() == Backend::Postgres;
    let mut first = store.write().await.unwrap();
    let claimed = first.try_claim_resources("host", &[2, 4], 2).await.unwrap();
    assert_eq!(claimed, (vec![2, 4], vec![]));
    if !postgres {
        // One writer at a time: the first ones wanted, nobody to pass over.
        let (claimed, contended) = first
            .try_claim_resources("host", &[1, 2, 3], 2)
            .await
            .unwrap();
        assert_eq!((claimed, contended), (vec![1, 2], vec![]));
        first.rollback().await.unwrap();
        return;
    }

    let mut second = store.write().await.unwrap();
    let (claimed, contended) = second
        .try_claim_resources("host", &[1, 2, 3, 4, 5, 6], 2)
        .await
        .unwrap();
    assert_eq!(
        claimed,
        vec![1, 3],
        "the first two free, in the order given"
    );
    assert_eq!(
        contended,
        vec![2],
        "passed over before the second was taken"
    );
    // Host 5 was not tried: a third writer gets it at once.
    let mut third = store.write().await.unwrap();
    let (claimed, contended) = third
        .try_claim_resources("host", &[3, 4, 5, 6], 4)
        .await
        .unwrap();
    assert_eq!((claimed, contended), (vec![5, 6], vec![3, 4]));
    // Fewer free than wanted: everything was tried.
    let (claimed, contended) = second
        .try_claim_resources("host", &[4, 5, 7], 3)
        .await
        .unwrap();
    assert_eq!((claimed, contended), (vec![7], vec![4, 5]));
    for tx in [first, second, third] {
        tx.rollback().await.unwrap();
    }
}

/// A worker found gone gives up its task claims, a reconciler pass's too (held as
/// "<worker> <pass>"), and no other worker's, one whose id it begins included.
#[tokio::test]
async fn a_gone_workers_task_claims_end_with_its_passes() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let at = |minute: u32| t(2030, 1, 1, 10, minute);
    let claim = async |task: &'static str, holder: &'static str| {
        let mut tx = store.write().await.unwrap();
        let got = tx
            .claim_task(&TaskTerm {
                task,
                holder,
                now: at(1),
                until: at(5),
            })
            .await
            .unwrap();
        tx.commit().await.unwrap();
        got
    };
    assert!(claim("reconcile", "w-1 pass-a").await);
    assert!(claim("monitor", "w-1").await);
    assert!(claim("publish", "w-10 pass-b").await);
    store.release_worker("w-1").await.unwrap();
    assert!(claim("reconcile", "w-2 pass-c").await);
    assert!(claim("monitor", "w-2").await);
    assert!(!claim("publish", "w-2").await, "w-10's claim is not w-1's");
}

#[tokio::test]
async fn a_task_claim_has_one_holder_until_it_runs_out() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let at = |minute: u32| t(2030, 1, 1, 10, minute);
    let claim = async |holder: &'static str, now: u32, until: u32| {
        let mut tx = store.write().await.unwrap();
        let got = tx
            .claim_task(&TaskTerm {
                task: "reconcile",
                holder,
                now: at(now),
                until: at(until),
            })
            .await
            .unwrap();
        tx.commit().await.unwrap();
        got
    };
    let renew = async |holder: &'static str, now: u32, until: u32| {
        let mut tx = store.write().await.unwrap();
        let got = tx
            .renew_task(&TaskTerm {
                task: "reconcile",
                holder,
                now: at(now),
                until: at(until),
            })
            .await
            .unwrap();
        tx.commit().await.unwrap();
        got
    };
    let holder = async || {
        let mut tx = store.read().await.unwrap();
        let claim = tx.task_claim("reconcile").await.unwrap();
        tx.commit().await.unwrap();
        claim
    };
    assert!(claim("a", 0, 2).await);
    // Held: neither another holder nor the same one claims it again.
    assert!(!claim("b", 1, 3).await);
    assert!(!claim("a", 1, 3).await);

    // Its holder renews it; no one else can.
    assert!(!renew("b", 1, 5).await);
    assert!(renew("a", 1, 5).await);
    assert_eq!(
        holder().await,
        Some(TaskClaim {
            holder: "a".into(),
            held_until: at(5)
        })
    );

    // Run out, it is free for anyone; its old holder's renewal then fails.
    assert!(!claim("b", 4, 8).await);
    assert!(claim("b", 5, 8).await);
    assert!(!renew("a", 6, 10).await);
    // A holder that let it run out has lost it, even if no one took it meanwhile; it may
    // claim it again.
    assert!(!renew("b", 9, 12).await);
    assert!(claim("b", 9, 12).await);

    // Released only by whoever holds it.
    let mut tx = store.write().await.unwrap();
    tx.release_task("reconcile", "a").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(holder().await.map(|c| c.holder), Some("b".into()));
    let mut tx = store.write().await.unwrap();
    tx.release_task("reconcile", "b").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(holder().await, None);
    assert!(claim("c", 9, 11).await);
    store.close().await;
}

#[tokio::test]
async fn what_a_repair_holds_is_not_claimed_and_a_hold_is_refused_on_news() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let r1 = seed_lease(&store, "l1").await;
    let r2 = seed_lease(&store, "l2").await;
    let r3 = seed_lease(&store, "l3").await;
    let now = created() + Duration::minutes(1);
    let claim_for = Duration::minutes(5);
    let record = async |lease: &str, reservation: &str, hosts: &[i64]| {
        let mut tx = store.write().await.unwrap();
        let seq = tx
            .insert_action(&rows::action(lease, reservation, hosts))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        seq
    };
    let claim = async |at: DateTime<Utc>| {
        let mut tx = store.write().await.unwrap();
        let claimed: Vec<i64> = tx
            .claim_actions(at, "worker", claim_for, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.seq)
            .collect();
        tx.commit().await.unwrap();
        claimed
    };
    let finish = async |seq: i64| {
        let mut tx = store.write().await.unwrap();
        let done = blazar_db::ActionOutcome::Done;
        assert!(tx.finish_action(seq, "worker", &done, now).await.unwrap());
        tx.commit().await.unwrap();
    };
    let seen = async || {
        let mut tx = store.read().await.unwrap();
        let seen = tx.actions_seen().await.unwrap();
        tx.commit().await.unwrap();
        seen
    };
    let hold_as = async |holder: &str, item: &RepairItem, seen: &ActionsSeen| {
        let mut tx = store.write().await.unwrap();
        let held = tx.hold_for_repair(holder, item, seen, now).await.unwrap();
        tx.commit().await.unwrap();
        held
    };
    let hold = async |item: &RepairItem, seen: &ActionsSeen| hold_as("pass", item, seen).await;
    let release = async || {
        let mut tx = store.write().await.unwrap();
        tx.release_repair_holds("pass").await.unwrap();
        tx.commit().await.unwrap();
    };
    let first = record("l1", &r1, &[1]).await;
    assert_eq!(claim(now).await, vec![first]);
    finish(first).await;
    let host = |id: i64| ("physical:host".to_string(), id);
    let lease_one = RepairItem {
        lease_id: Some("l1".into()),
        resources: vec![host(2)],
    };

    // The pass holds its task claim: holds are taken under it, and count while it holds.
    let mut tx = store.write().await.unwrap();
    assert!(
        tx.claim_task(&TaskTerm {
            task: RECONCILE_TASK,
            holder: "pass",
            now,
            until: now + Duration::minutes(2),
        })
        .await
        .unwrap()
    );
    tx.commit().await.unwrap();

    // An open action on what the repair would change, or one recorded after the pass read
    // the database: refused.
    let read = seen().await;
    let open = record("l2", &r2, &[2]).await;
    assert!(!hold(&lease_one, &read).await);
    assert!(!hold(&lease_one, &seen().await).await);
    assert_eq!(claim(now).await, vec![open]);
    finish(open).await;
    assert!(!hold(&lease_one, &read).await, "news to the first read");

    // Nothing new: held, by the claim's holder only.
    let read = seen().await;
    assert!(!hold_as("another pass", &lease_one, &read).await);
    assert!(hold(&lease_one, &read).await);
    let of_lease = record("l1", &r1, &[3]).await;
    let on_host = record("l2", &r2, &[2]).await;
    let elsewhere = record("l3", &r3, &[4]).await;
    // The lease's actions and those on its hosts wait; others do not.
    assert_eq!(claim(now).await, vec![elsewhere]);
    // A claim run out frees them, as does the release.
    assert_eq!(
        claim(now + Duration::minutes(3)).await,
        vec![of_lease, on_host]
    );
    for seq in [of_lease, on_host, elsewhere] {
        finish(seq).await;
    }
    // (The claim still holds at `now`.)
    let late = record("l1", &r1, &[5]).await;
    assert!(claim(now).await.is_empty());
    release().await;
    assert_eq!(claim(now).await, vec![late]);
    store.close().await;
}

/// On PostgreSQL, a session of its own beside the store's pool, and the application name
/// every session of the pool carries (the test database's): how a test sees the pool's
/// sessions in `pg_stat_activity`. `None` on SQLite.
async fn pool_observer(db: &TestDatabase) -> Option<(sqlx::PgConnection, String)> {
    if !db.is_postgres() {
        return None;
    }
    let observer = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    let application = db.url.split("application_name=").nth(1).unwrap_or("");
    Some((observer, application.to_string()))
}

/// A transaction abandoned at any point, its `BEGIN` on the wire included (a client that
/// hangs up mid-request), leaves no connection inside a transaction: on PostgreSQL the pool
/// would hand such a connection to the next caller, whose statements would then run, and
/// hold their locks, in a transaction nobody ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_transaction_leaves_no_connection_inside_it() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let mut observer = pool_observer(&db).await;
    for round in 0..120u64 {
        // Dropped (at the end of this block) after one to a dozen polls, each after the
        // database had time to answer the last step: every await of the transaction,
        // `BEGIN`'s included, is where one stops.
        {
            let begun = std::pin::pin!(async {
                let mut tx = if round % 2 == 0 {
                    store.read().await?
                } else {
                    store.write().await?
                };
                tx.list_hosts().await?;
                tx.commit().await
            });
            let mut begun = begun;
            for _ in 0..=(round % 12) {
                let polled =
                    std::future::poll_fn(|cx| std::task::Poll::Ready(begun.as_mut().poll(cx)))
                        .await;
                if polled.is_ready() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
        }
        let Some((observer, application)) = observer.as_mut() else {
            continue;
        };
        // What was abandoned is rolled back as soon as its connection is back in the pool.
        let mut stuck = 0;
        for _ in 0..100 {
            stuck = sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                 AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()",
            )
            .bind(&*application)
            .fetch_one(&mut *observer)
            .await
            .unwrap();
            if stuck == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            stuck, 0,
            "round {round}: a pooled connection is left in a transaction"
        );
    }
    for _ in 0..8 {
        let mut tx = store.read().await.unwrap();
        assert!(tx.list_hosts().await.unwrap().is_empty());
        tx.commit().await.unwrap();
    }
}

#[tokio::test]
async fn queued_writes_keep_their_text_their_order_and_their_counts() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    // Text a statement could mistake for its own, were values ever written into a
    // statement instead of bound: quotes, backslashes, placeholders, a statement's end.
    let names = [
        "it's",
        "back\\slash\\",
        "\\'; DROP TABLE leases; --",
        "$1 $2 $$ E'x' ::int8",
        "naïve\nline\ttab 漢字 🙂",
        "",
    ];
    let (start, end) = (t(2030, 1, 1, 10, 0), t(2030, 1, 1, 12, 0));
    let mut tx = store.write().await.unwrap();
    for (i, name) in names.iter().enumerate() {
        let mut lease = rows::lease(&format!("q{i}"), start, end);
        lease.name = (*name).to_string();
        tx.insert_lease(&lease).await.unwrap();
    }
    // An insert, then an update of the row it inserted (on SQLite in one queue): in order.
    tx.insert_event(&rows::event("q0-start", "q0", "start_lease", start))
        .await
        .unwrap();
    let mut renamed = rows::lease("q0", start, end);
    renamed.name = "it''s now".into();
    tx.update_lease(&renamed).await.unwrap();
    // A counted write after queued ones answers its own count, not theirs.
    assert!(tx.fail_event("q0-start", "q0", created()).await.unwrap());
    assert!(!tx.fail_event("q0-start", "q0", created()).await.unwrap());
    tx.commit().await.unwrap();

    let mut tx = store.read().await.unwrap();
    let q0 = tx.get_lease("q0").await.unwrap().unwrap();
    assert_eq!(q0.name, "it''s now");
    assert_eq!(q0.status, blazar_core::LeaseStatus::Error);
    for (i, name) in names.iter().enumerate().skip(1) {
        let lease = tx.get_lease(&format!("q{i}")).await.unwrap().unwrap();
        assert_eq!(lease.name, *name);
    }
    tx.commit().await.unwrap();

    // A refusal surfaces by the commit at the latest, and nothing of the transaction stays.
    let refused = in_write(&store, async |tx| {
        tx.insert_lease(&rows::lease("q-new", start, end)).await?;
        tx.insert_lease(&rows::lease("q1", start, end)).await
    })
    .await;
    assert!(matches!(refused, Err(DbError::Duplicate(_))), "{refused:?}");
    let mut tx = store.read().await.unwrap();
    assert_eq!(tx.get_lease("q-new").await.unwrap(), None);
    tx.commit().await.unwrap();

    // PostgreSQL's text holds no NUL: a refusal, not an error of the server.
    if store.backend() == Backend::Postgres {
        let mut lease = rows::lease("q-nul", start, end);
        lease.name = "nul\0here".into();
        let refused = in_write(&store, async |tx| tx.insert_lease(&lease).await).await;
        assert!(matches!(refused, Err(DbError::Rejected(_))), "{refused:?}");
    }
    store.close().await;
}

/// A pooled PostgreSQL connection handed back a moment ago is not pinged before its next
/// use. When every one of them died meanwhile (the server restarted, an operator ended the
/// sessions), the next transaction still begins: its `BEGIN` fails on one dead connection,
/// and the others, idle since before the cut, are pinged before use and replaced.
#[tokio::test]
async fn a_transaction_begins_whole_after_its_pooled_connection_was_cut() {
    let db = TestDatabase::new().await;
    let Some((mut observer, application)) = pool_observer(&db).await else {
        return;
    };
    let store = connect(&db).await;
    for round in 0..3 {
        // Every connection of the pool (four) in use at once, then back in the pool,
        // pinged on its way there; then all cut.
        let mut open = Vec::new();
        for _ in 0..4 {
            open.push(store.read().await.unwrap());
        }
        for mut tx in open {
            tx.list_hosts().await.unwrap();
            tx.commit().await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let cut: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid()) AS ended",
        )
        .bind(&application)
        .fetch_one(&mut observer)
        .await
        .unwrap();
        assert_eq!(cut, 4, "round {round}: the pool's sessions to cut");
        let mut tx = store
            .write()
            .await
            .unwrap_or_else(|e| panic!("round {round}: no transaction after the cut: {e}"));
        assert!(tx.list_hosts().await.unwrap().is_empty());
        tx.commit().await.unwrap();
    }
    store.close().await;
}

/// A calendar feed reads a project's latest leases by start, never the project's history.
#[tokio::test]
async fn a_projects_latest_leases_are_read_without_the_rest() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    in_write(&store, async |tx| {
        for day in 1..=9 {
            let mut lease = rows::lease(
                &format!("l{day}"),
                t(2030, 1, day, 10, 0),
                t(2030, 1, day, 12, 0),
            );
            if day % 3 == 0 {
                lease.project_id = "other".into();
            }
            tx.insert_lease(&lease).await?;
        }
        Ok(())
    })
    .await
    .unwrap();
    let mut tx = store.read().await.unwrap();
    let latest = tx.latest_lease_ids("project", 3).await.unwrap();
    assert_eq!(latest, ["l8", "l7", "l5"]);
    assert_eq!(
        tx.latest_lease_ids("other", 10).await.unwrap(),
        ["l9", "l6", "l3"]
    );
    assert!(tx.latest_lease_ids("nobody", 10).await.unwrap().is_empty());
    tx.commit().await.unwrap();
    store.close().await;
}

/// Hand-overs come a page at a time, each page going on from the last one's place (ties on
/// the start broken by id), filtered before paging.
#[tokio::test]
async fn hand_overs_are_read_by_pages_in_their_order() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    in_write(&store, async |tx| {
        for i in 0..25_i64 {
            tx.start_handover(&blazar_core::Handover {
                resource_type: if i % 5 == 0 {
                    "network"
                } else {
                    "physical:host"
                }
                .into(),
                resource_id: i % 4,
                project_id: if i % 2 == 0 { "even" } else { "odd" }.into(),
                lease_id: format!("lease-{}", i % 3),
                reservation_id: format!("r{i}"),
                started_at: t(2030, 1, 1, 10, 0) + Duration::hours(i / 6),
                ended_at: None,
            })
            .await?;
        }
        tx.end_handovers("r3", None, t(2030, 2, 1, 0, 0)).await
    })
    .await
    .unwrap();
    let read_all = |filter: blazar_core::HandoverFilter, page: usize| {
        let store = store.clone();
        async move {
            let mut tx = store.read().await.unwrap();
            let mut out = Vec::new();
            let mut after = None;
            loop {
                let got = tx
                    .handovers_page(&filter, after.as_ref(), page)
                    .await
                    .unwrap();
                assert!(got.len() <= page);
                let full = got.len() == page;
                for (place, listed) in got {
                    after = Some(place);
                    out.push(listed.handover);
                }
                if !full {
                    break;
                }
            }
            tx.commit().await.unwrap();
            out
        }
    };
    let everything = blazar_core::HandoverFilter {
        include_ended: true,
        ..Default::default()
    };
    let whole = read_all(everything.clone(), 100).await;
    assert_eq!(whole.len(), 25);
    let key = |h: &blazar_core::Handover| (h.resource_type.clone(), h.resource_id, h.started_at);
    assert!(whole.windows(2).all(|w| key(&w[0]) <= key(&w[1])));
    for page in [1, 2, 3, 7] {
        assert_eq!(
            read_all(everything.clone(), page).await,
            whole,
            "pages of {page}"
        );
    }
    let open = read_all(blazar_core::HandoverFilter::default(), 4).await;
    assert_eq!(open.len(), 24);
    assert!(open.iter().all(|h| h.reservation_id != "r3"));
    let odd_hosts = read_all(
        blazar_core::HandoverFilter {
            resource_type: Some("physical:host".into()),
            project_id: Some("odd".into()),
            include_ended: true,
            ..Default::default()
        },
        2,
    )
    .await;
    let expected: Vec<_> = whole
        .iter()
        .filter(|h| h.resource_type == "physical:host" && h.project_id == "odd")
        .cloned()
        .collect();
    assert_eq!(odd_hosts, expected);
    assert_eq!(odd_hosts.len(), 10);
    let of_lease = read_all(
        blazar_core::HandoverFilter {
            lease_id: Some("lease-1".into()),
            include_ended: true,
            ..Default::default()
        },
        3,
    )
    .await;
    assert_eq!(of_lease.len(), 8);
    store.close().await;
}

/// A reservation is recorded while its row lives, and after its lease is deleted through
/// the actions it left; an id the database never had is not.
#[tokio::test]
async fn a_reservation_stays_recorded_through_its_actions() {
    let db = TestDatabase::new().await;
    let store = connect(&db).await;
    let recorded = async |id: &str| {
        let mut tx = store.read().await.unwrap();
        tx.reservation_recorded(id).await.unwrap()
    };
    let kept = seed_lease(&store, "l1").await;
    let deleted = seed_lease(&store, "l2").await;
    let quiet = seed_lease(&store, "l3").await;
    in_write(&store, async |tx| {
        tx.insert_action(&rows::action("l2", &deleted, &[1]))
            .await?;
        tx.delete_lease("l2").await?;
        tx.delete_lease("l3").await
    })
    .await
    .unwrap();
    assert!(recorded(&kept).await);
    assert!(recorded(&deleted).await);
    // Deleted without an action ever recorded: nothing of it reached the cloud.
    assert!(!recorded(&quiet).await);
    assert!(!recorded("never-had").await);
    store.close().await;
}
