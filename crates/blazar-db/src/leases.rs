//! Leases and reservations.

use blazar_core::{Event, Lease, LeaseFilter, Reservation, ReservationSpec};

use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::events::{EventTuple, event_from_tuple};
use crate::{Arg, Columns, DbError, DbResult, Tx, from_opt_secs, from_secs, wire};

const LEASE_COLUMNS: &str = "id, name, user_id, project_id, trust_id, start_at, end_at, status, \
    degraded, created_at, updated_at, keystone_trust";

const RESERVATION_COLUMNS: &str = "r.id, r.lease_id, r.ordinal, r.resource_id, r.resource_type, \
    r.status, r.missing_resources, r.resources_changed, r.params, r.granted_units, r.created_at, \
    r.updated_at";

fn lease_from_row(row: &AnyRow) -> DbResult<Lease> {
    lease_from_tuple((
        row.try_get("id")?,
        row.try_get("name")?,
        row.try_get("user_id")?,
        row.try_get("project_id")?,
        row.try_get("trust_id")?,
        row.try_get("start_at")?,
        row.try_get("end_at")?,
        row.try_get("status")?,
        row.try_get("degraded")?,
        row.try_get("created_at")?,
        row.try_get("updated_at")?,
        row.try_get("keystone_trust")?,
    ))
}

/// A lease from its columns in table order, as a row or as a JSON array holds them.
fn lease_from_tuple(t: LeaseColumns) -> DbResult<Lease> {
    Ok(Lease {
        id: t.0,
        name: t.1,
        user_id: t.2,
        project_id: t.3,
        trust_id: t.4,
        keystone_trust: t.11 != 0,
        start: from_secs(t.5)?,
        end: from_secs(t.6)?,
        status: wire(&t.7, "lease status")?,
        degraded: t.8 != 0,
        created_at: from_secs(t.9)?,
        updated_at: from_opt_secs(t.10)?,
    })
}

fn reservation_from_row(row: &AnyRow) -> DbResult<Reservation> {
    reservation_from_tuple((
        row.try_get("id")?,
        row.try_get("lease_id")?,
        row.try_get("ordinal")?,
        row.try_get("resource_id")?,
        row.try_get("resource_type")?,
        row.try_get("status")?,
        row.try_get("missing_resources")?,
        row.try_get("resources_changed")?,
        row.try_get("params")?,
        row.try_get("granted_units")?,
        row.try_get("created_at")?,
        row.try_get("updated_at")?,
    ))
}

/// A reservation from its columns in table order, as a row or as a JSON array holds them.
fn reservation_from_tuple(t: ReservationTuple) -> DbResult<Reservation> {
    let (
        id,
        lease_id,
        ordinal,
        resource_id,
        kind,
        status,
        missing,
        changed,
        params,
        granted_units,
        created_at,
        updated_at,
    ) = t;
    let spec = match serde_json::from_str(&params) {
        Ok(Value::Object(map)) => ReservationSpec::from_stored(&kind, &map)
            .map_err(|e| DbError::Corrupt(format!("reservation params {params:?}: {e}")))?,
        _ => return Err(DbError::Corrupt(format!("reservation params {params:?}"))),
    };
    Ok(Reservation {
        id,
        lease_id,
        ordinal,
        resource_id,
        status: wire(&status, "reservation status")?,
        missing_resources: missing != 0,
        resources_changed: changed != 0,
        spec,
        granted_units,
        created_at: from_secs(created_at)?,
        updated_at: from_opt_secs(updated_at)?,
    })
}

/// The columns of a lease an update may change, first in its insert and update alike, so
/// both store them the same way.
fn lease_changes(lease: &Lease) -> Columns {
    Columns::default()
        .set("name", &lease.name)
        .set("start_at", lease.start)
        .set("end_at", lease.end)
        .set("status", lease.status)
        .set("degraded", lease.degraded)
        .set("updated_at", lease.updated_at)
}

/// The columns of a reservation an update may change, first in its insert and update alike.
fn reservation_changes(r: &Reservation) -> Columns {
    Columns::default()
        .set("status", r.status)
        .set("missing_resources", r.missing_resources)
        .set("resources_changed", r.resources_changed)
        .set("params", Value::Object(r.spec.fields()).to_string())
        .set("updated_at", r.updated_at)
        .set("granted_units", r.granted_units)
}

/// The WHERE clause of a lease filter (over table alias `l`) and its bound values, numbered
/// from `$1`.
fn filter_clause(backend: crate::Backend, filter: &LeaseFilter) -> (String, Vec<String>) {
    let mut conditions = Vec::new();
    let mut values = Vec::new();
    for (column, value) in [
        ("l.id", &filter.id),
        ("l.project_id", &filter.project_id),
        ("l.user_id", &filter.user_id),
        ("l.status", &filter.status),
        ("l.name", &filter.name),
    ] {
        if let Some(v) = value {
            values.push(v.clone());
            conditions.push(format!("{column} = ${}", values.len()));
        }
    }
    if let Some(ids) = &filter.ids {
        if ids.is_empty() {
            conditions.push("1 = 0".to_string());
        } else {
            let (list, ids) = crate::in_list(backend, values.len() + 1, ids);
            conditions.push(format!("l.id IN ({list})"));
            values.extend(ids);
        }
    }
    if conditions.is_empty() {
        (String::new(), values)
    } else {
        (format!(" WHERE {}", conditions.join(" AND ")), values)
    }
}

impl Tx {
    pub async fn insert_lease(&mut self, lease: &Lease) -> DbResult<()> {
        self.lease_revised(&lease.id);
        let (sql, args) = lease_changes(lease)
            .set("id", &lease.id)
            .set("user_id", &lease.user_id)
            .set("project_id", &lease.project_id)
            .set("trust_id", &lease.trust_id)
            .set("created_at", lease.created_at)
            .set("keystone_trust", lease.keystone_trust)
            .insert("leases");
        self.write(&sql, args).await
    }

    /// Rewrites the mutable columns of a lease.
    pub async fn update_lease(&mut self, lease: &Lease) -> DbResult<()> {
        self.lease_revised(&lease.id);
        let (sql, args) =
            lease_changes(lease).update("leases", ", revision = revision + 1", "id", &lease.id);
        self.write(&sql, args).await
    }

    pub async fn get_lease(&mut self, id: &str) -> DbResult<Option<Lease>> {
        let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE id = $1");
        self.fetch_optional_as(&sql, vec![id.into()], lease_from_row)
            .await
    }

    /// Reads a lease and, on PostgreSQL, locks it until the transaction ends, so an update,
    /// a delete and an event of one lease never interleave.
    pub async fn lock_lease(&mut self, id: &str) -> DbResult<Option<Lease>> {
        Ok(self.lock_leases(&[id]).await?.pop())
    }

    /// [`Tx::lock_lease`] for several leases at once, in id order (the order every
    /// transaction that locks more than one lease takes them in). Leases that do not exist
    /// are left out.
    pub async fn lock_leases(&mut self, ids: &[&str]) -> DbResult<Vec<Lease>> {
        // Healing locks leases while holding claims: a transaction holding a lease must not
        // then wait for a claim.
        self.holds_resources = true;
        let lock = self.for_update();
        self.fetch_all_in(
            ids,
            |list| {
                format!("SELECT {LEASE_COLUMNS} FROM leases WHERE id IN ({list}) ORDER BY id{lock}")
            },
            lease_from_row,
        )
        .await
    }

    /// [`Tx::lock_lease`] that does not wait: `None` when the lease does not exist or
    /// another transaction holds it (one this transaction holds is returned). For work that
    /// may be left to a later pass (refilling degraded leases), taken while holding rows
    /// and claims, where waiting for a lease locked out of id order could close a circle.
    pub async fn try_lock_lease(&mut self, id: &str) -> DbResult<Option<Lease>> {
        self.holds_resources = true;
        let lock = match self.backend {
            crate::Backend::Postgres => " FOR UPDATE SKIP LOCKED",
            crate::Backend::Sqlite => "",
        };
        let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE id = $1{lock}");
        self.fetch_optional_as(&sql, vec![id.into()], lease_from_row)
            .await
    }

    pub async fn delete_lease(&mut self, id: &str) -> DbResult<()> {
        // Children first: not every SQLite connection enforces ON DELETE CASCADE.
        for sql in [
            "DELETE FROM allocations WHERE lease_id = $1",
            "DELETE FROM events WHERE lease_id = $1",
            "DELETE FROM reservations WHERE lease_id = $1",
            "DELETE FROM leases WHERE id = $1",
        ] {
            self.write(sql, vec![id.into()]).await?;
        }
        Ok(())
    }

    pub async fn insert_reservation(&mut self, r: &Reservation) -> DbResult<()> {
        self.revise_lease(&r.lease_id);
        let (sql, args) = reservation_changes(r)
            .set("id", &r.id)
            .set("lease_id", &r.lease_id)
            .set("ordinal", r.ordinal)
            .set("resource_id", &r.resource_id)
            .set("resource_type", r.resource_type())
            .set("created_at", r.created_at)
            .insert("reservations");
        self.write(&sql, args).await
    }

    pub async fn update_reservation(&mut self, r: &Reservation) -> DbResult<()> {
        self.revise_lease(&r.lease_id);
        let (sql, args) = reservation_changes(r).update("reservations", "", "id", &r.id);
        self.write(&sql, args).await
    }

    pub async fn reservations_of(&mut self, lease_id: &str) -> DbResult<Vec<Reservation>> {
        self.reservations_of_leases(&[lease_id]).await
    }

    /// The reservations of several leases, each lease's by ordinal.
    pub async fn reservations_of_leases(&mut self, ids: &[&str]) -> DbResult<Vec<Reservation>> {
        self.fetch_all_in(
            ids,
            |list| {
                format!(
                    "SELECT {RESERVATION_COLUMNS} FROM reservations r WHERE r.lease_id IN ({list}) \
                     ORDER BY r.lease_id, r.ordinal"
                )
            },
            reservation_from_row,
        )
        .await
    }

    /// Reservations that hold fewer units than they were granted (healing fills them).
    pub async fn reservations_missing_resources(&mut self) -> DbResult<Vec<Reservation>> {
        let sql = format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations r WHERE r.missing_resources = 1 \
             AND r.status IN ('pending', 'active') ORDER BY r.lease_id, r.ordinal"
        );
        self.fetch_all_as(&sql, Vec::new(), reservation_from_row)
            .await
    }

    pub async fn get_reservation(&mut self, id: &str) -> DbResult<Option<Reservation>> {
        let sql = format!("SELECT {RESERVATION_COLUMNS} FROM reservations r WHERE r.id = $1");
        self.fetch_optional_as(&sql, vec![id.into()], reservation_from_row)
            .await
    }
}

/// A lease with its reservations (by ordinal) and events (in time order).
pub type LeaseTree = (Lease, Vec<Reservation>, Vec<Event>);

/// Reservation columns as one JSON array each (see [`Tx::lease_trees`]).
type ReservationTuple = (
    String,
    String,
    i64,
    String,
    String,
    String,
    i64,
    i64,
    String,
    i64,
    i64,
    Option<i64>,
);

/// The lease columns in table order up to `updated_at`, then `$rest`: a row of
/// `LEASE_COLUMNS` and an element of the array [`Tx::lease_trees`] reads differ only after
/// them.
macro_rules! lease_tuple {
    ($($rest:ty),+) => {
        (String, String, String, String, String, i64, i64, String, i64, i64, Option<i64>, $($rest),+)
    };
}

/// Lease columns in table order (`keystone_trust`, added later, last).
type LeaseColumns = lease_tuple!(i64);

/// A lease with its reservations and events, as one element of the array
/// [`Tx::lease_trees`] reads: the lease columns in table order, then the children, the
/// revision and `keystone_trust`.
type LeaseTuple = lease_tuple!(
    Option<Vec<ReservationTuple>>,
    Option<Vec<EventTuple>>,
    i64,
    i64
);

fn lease_tree_from_tuple(t: LeaseTuple) -> DbResult<(i64, LeaseTree)> {
    let lease = lease_from_tuple((t.0, t.1, t.2, t.3, t.4, t.5, t.6, t.7, t.8, t.9, t.10, t.14))?;
    let reservations =
        t.11.unwrap_or_default()
            .into_iter()
            .map(reservation_from_tuple)
            .collect::<DbResult<_>>()?;
    let events =
        t.12.unwrap_or_default()
            .into_iter()
            .map(event_from_tuple)
            .collect::<DbResult<_>>()?;
    Ok((t.13, (lease, reservations, events)))
}

impl Tx {
    /// Leases matching `filter` with their reservations and events, in one query that
    /// returns one row: the whole list as a JSON array, each lease with its children nested.
    /// Rows cost more than their bytes here (sqlx hands each SQLite row from the
    /// connection's thread to the task on its own), so a list of a hundred leases is one row
    /// rather than a hundred, or the thousand its children would be.
    pub async fn lease_trees(&mut self, filter: &LeaseFilter) -> DbResult<Vec<LeaseTree>> {
        Ok(self
            .revised_lease_trees(filter)
            .await?
            .into_iter()
            .map(|(_, tree)| tree)
            .collect())
    }

    /// [`Tx::lease_trees`], each with the lease's revision as this transaction read it.
    pub async fn revised_lease_trees(
        &mut self,
        filter: &LeaseFilter,
    ) -> DbResult<Vec<(i64, LeaseTree)>> {
        let (clause, values) = filter_clause(self.backend, filter);
        // The children come out of their subqueries as text; json() and the cast nest them
        // as JSON rather than as strings.
        let (agg, array) = self.json_functions();
        let (reservations, events) = match self.backend {
            crate::Backend::Sqlite => ("json(t.reservations)", "json(t.events)"),
            crate::Backend::Postgres => ("CAST(t.reservations AS JSON)", "CAST(t.events AS JSON)"),
        };
        // CAST(... AS TEXT): PostgreSQL's json comes back as text for the Any driver.
        let sql = format!(
            "SELECT CAST({agg}({array}(t.id, t.name, t.user_id, t.project_id, t.trust_id, \
                t.start_at, t.end_at, t.status, t.degraded, t.created_at, t.updated_at, \
                {reservations}, {events}, t.revision, t.keystone_trust) ORDER BY t.created_at, t.id) AS TEXT) \
                AS json \
             FROM (SELECT l.id, l.name, l.user_id, l.project_id, l.trust_id, l.start_at, \
               l.end_at, l.status, l.degraded, l.created_at, l.updated_at, l.revision, \
               l.keystone_trust, \
               (SELECT CAST({agg}({array}(r.id, r.lease_id, r.ordinal, r.resource_id, \
                  r.resource_type, r.status, r.missing_resources, r.resources_changed, \
                  r.params, r.granted_units, r.created_at, r.updated_at) ORDER BY r.ordinal) \
                  AS TEXT) FROM reservations r WHERE r.lease_id = l.id) AS reservations, \
               (SELECT CAST({agg}({array}(e.id, e.lease_id, e.event_type, e.event_time, \
                  e.rank, e.status, e.created_at, e.updated_at) ORDER BY e.event_time, e.rank) \
                  AS TEXT) FROM events e WHERE e.lease_id = l.id) AS events \
               FROM leases l{clause}) t"
        );
        let args = values.into_iter().map(Arg::from).collect();
        let tuples: Vec<LeaseTuple> = self.fetch_json_array(&sql, args, "leases").await?;
        tuples.into_iter().map(lease_tree_from_tuple).collect()
    }

    /// The ids of a project's `limit` leases that start last (a calendar feed's), read
    /// without reading the project's older leases.
    pub async fn latest_lease_ids(
        &mut self,
        project_id: &str,
        limit: usize,
    ) -> DbResult<Vec<String>> {
        let rows = self
            .fetch_rows(
                "SELECT id FROM leases WHERE project_id = $1 \
                 ORDER BY start_at DESC, id DESC LIMIT $2",
                vec![project_id.into(), (limit as i64).into()],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get("id"))
            .collect::<Result<_, _>>()?)
    }

    /// The ids and revisions of the leases matching `filter`, in list order: what a reader
    /// that keeps rendered leases needs to tell which it can reuse. One row (a JSON array),
    /// for the same reason as [`Tx::lease_trees`].
    pub async fn lease_revisions(&mut self, filter: &LeaseFilter) -> DbResult<Vec<(String, i64)>> {
        let (clause, values) = filter_clause(self.backend, filter);
        let (agg, array) = self.json_functions();
        let sql = format!(
            "SELECT CAST({agg}({array}(l.id, l.revision) ORDER BY l.created_at, l.id) AS TEXT) \
             AS json FROM leases l{clause}"
        );
        let args = values.into_iter().map(Arg::from).collect();
        self.fetch_json_array(&sql, args, "lease revisions").await
    }
}
