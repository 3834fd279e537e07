//! Allocations (which resource a reservation holds, and for when) and hand-overs (who holds a
//! resource right now).

use std::collections::HashSet;
use std::sync::Arc;

use blazar_core::{Allocation, Handover, HandoverFilter, HandoverPlace, ListedHandover, Occupancy};
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Arg, Backend, DbError, DbResult, Tx, from_opt_secs, from_secs, to_secs};

/// An allocation to write: the database gives it its id.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAllocation {
    pub reservation_id: String,
    pub lease_id: String,
    pub resource_type: String,
    pub resource_id: i64,
    pub occupancy: Occupancy,
}

impl NewAllocation {
    /// An exclusive allocation of a whole resource.
    pub fn whole(
        reservation_id: &str,
        lease_id: &str,
        resource_type: &str,
        resource_id: i64,
        window: (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>),
    ) -> NewAllocation {
        NewAllocation {
            reservation_id: reservation_id.to_string(),
            lease_id: lease_id.to_string(),
            resource_type: resource_type.to_string(),
            resource_id,
            occupancy: Occupancy::whole(window.0, window.1, window.2),
        }
    }
}

/// Resource ids per statement of [`Tx::usage_among`].
const USAGE_CHUNK: usize = 500;

/// What one allocation holds of its resource, and when: all an instance search needs.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocationUsage {
    pub resource_id: i64,
    pub exclusive: bool,
    pub start: DateTime<Utc>,
    pub blocked_until: DateTime<Utc>,
    pub units: i64,
    pub vcpus: i64,
    pub memory_mb: i64,
    pub disk_gb: i64,
}

impl AllocationUsage {
    /// What it uses of its resource's capacity for instances: `units` slots of its size.
    pub fn usage(&self) -> blazar_core::engine::Usage {
        blazar_core::engine::Usage {
            vcpus: self.vcpus,
            memory_mb: self.memory_mb,
            disk_gb: self.disk_gb,
        }
        .times(self.units)
    }
}

/// An allocation as the allocations API shows it: with its lease's dates.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocationView {
    pub resource_id: i64,
    /// Shared by the allocations of one reservation (a lease of a rack holds a hundred).
    pub reservation_id: Arc<str>,
    pub lease_id: Arc<str>,
    pub lease_start: DateTime<Utc>,
    pub lease_end: DateTime<Utc>,
}

/// Which allocations a list shows (every condition set must hold).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllocationFilter {
    /// Resources with internal ids in this inclusive range: one batch of a long list.
    pub resources: Option<(i64, i64)>,
    pub lease_id: Option<String>,
    pub reservation_id: Option<String>,
    /// Leases that end after this instant.
    pub ends_after: Option<DateTime<Utc>>,
    /// Leases that start before this instant, and of them the allocations that do.
    pub starts_before: Option<DateTime<Utc>>,
}

/// What a reservation was granted, with the resource's API id.
#[derive(Debug, Clone, PartialEq)]
pub struct GrantRow {
    pub reservation_id: String,
    pub resource_type: String,
    pub resource_id: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub units: i64,
}

/// A random key that keeps shared allocations apart in PostgreSQL's exclusion constraint.
fn share_key() -> i64 {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    let mut key = [0u8; 8];
    key.copy_from_slice(&bytes[..8]);
    // Positive and below i64::MAX, so `share_key + 1` cannot overflow.
    (i64::from_le_bytes(key) & 0x3fff_ffff_ffff_ffff) + 1
}

/// One reservation's allocations in a list batch: the reservation, its lease, the lease's
/// dates and the allocated resource ids joined by commas (a resource twice if it holds two
/// of the reservation's slots).
type Group = (String, String, i64, i64, String);

/// An allocation of type `$1` reaching into a window that starts at `$?` began at most the
/// type's longest span before it.
const SINCE_LONGEST_SPAN: &str = " AND a.start_at >= $? - COALESCE((SELECT max_span \
     FROM allocation_spans WHERE resource_type = $1), 0)";

/// The views of a batch's groups, sorted by resource, start and reservation.
fn views_of_groups(mut groups: Vec<Group>) -> DbResult<Vec<AllocationView>> {
    // The few reservations in start order first: the resources' stable sort below then
    // leaves each resource's allocations in that order, and it merges the reservations' runs
    // (each in index order) instead of sorting every allocation by the whole key.
    groups.sort_unstable_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
    let held = groups.iter().map(|g| g.4.split(',').count()).sum();
    let mut views = Vec::with_capacity(held);
    for (reservation_id, lease_id, lease_start, lease_end, resources) in groups {
        let (reservation_id, lease_id): (Arc<str>, Arc<str>) =
            (reservation_id.into(), lease_id.into());
        let (lease_start, lease_end) = (from_secs(lease_start)?, from_secs(lease_end)?);
        for id in resources.split(',') {
            let resource_id = id
                .parse::<i64>()
                .map_err(|_| DbError::Corrupt(format!("allocated resource id {id:?}")))?;
            views.push(AllocationView {
                resource_id,
                reservation_id: reservation_id.clone(),
                lease_id: lease_id.clone(),
                lease_start,
                lease_end,
            });
        }
    }
    views.sort_by_key(|v| v.resource_id);
    // A reservation holding instance slots on a host in two allocations (healing added to
    // what it held) is listed once there: the stable sort keeps those two side by side.
    views.dedup_by(|a, b| a.resource_id == b.resource_id && a.reservation_id == b.reservation_id);
    Ok(views)
}

fn allocation_from_row(row: &AnyRow) -> DbResult<Allocation> {
    Ok(Allocation {
        id: row.try_get("id")?,
        reservation_id: row.try_get("reservation_id")?,
        lease_id: row.try_get("lease_id")?,
        resource_type: row.try_get("resource_type")?,
        resource_id: row.try_get("resource_id")?,
        occupancy: Occupancy {
            start: from_secs(row.try_get("start_at")?)?,
            end: from_secs(row.try_get("end_at")?)?,
            blocked_until: from_secs(row.try_get("blocked_until")?)?,
            exclusive: row.try_get::<i64, _>("exclusive")? != 0,
            units: row.try_get("units")?,
            vcpus: row.try_get("vcpus")?,
            memory_mb: row.try_get("memory_mb")?,
            disk_gb: row.try_get("disk_gb")?,
        },
    })
}

const ALLOCATION_COLUMNS: &str = "id, reservation_id, lease_id, resource_type, resource_id, \
    start_at, end_at, blocked_until, exclusive, units, vcpus, memory_mb, disk_gb";

/// The statement of a page of hand-overs: an index range from the last page's place on
/// (`handovers_listing`), so no page reads the pages before it.
pub(crate) fn handovers_query(
    filter: &HandoverFilter,
    after: Option<&HandoverPlace>,
    limit: usize,
) -> (String, Vec<Arg>) {
    // With the API id of each resource: a host's id, the uid of any other resource.
    let mut sql = String::from(
        "SELECT h.id, h.resource_type, h.resource_id, \
         COALESCE(r.uid, CAST(h.resource_id AS TEXT)) AS api_id, h.project_id, h.lease_id, \
         h.reservation_id, h.started_at, h.ended_at FROM handovers h \
         LEFT JOIN resources r ON r.kind = h.resource_type AND r.id = h.resource_id \
         WHERE 1 = 1",
    );
    let mut args: Vec<Arg> = Vec::new();
    let mut equal = |column: &str, value: &Option<String>, args: &mut Vec<Arg>| {
        if let Some(v) = value {
            args.push(v.as_str().into());
            sql.push_str(&format!(" AND h.{column} = ${}", args.len()));
        }
    };
    equal("resource_type", &filter.resource_type, &mut args);
    equal("lease_id", &filter.lease_id, &mut args);
    equal("project_id", &filter.project_id, &mut args);
    if !filter.include_ended {
        sql.push_str(" AND h.ended_at IS NULL");
    }
    if let Some(place) = after {
        let n = args.len();
        sql.push_str(&format!(
            " AND (h.resource_type, h.resource_id, h.started_at, h.id) > (${}, ${}, ${}, ${})",
            n + 1,
            n + 2,
            n + 3,
            n + 4
        ));
        args.push(place.resource_type.as_str().into());
        args.push(place.resource_id.into());
        args.push(to_secs(place.started_at).into());
        args.push(place.id.as_str().into());
    }
    args.push((limit as i64).into());
    sql.push_str(&format!(
        " ORDER BY h.resource_type, h.resource_id, h.started_at, h.id LIMIT ${}",
        args.len()
    ));
    (sql, args)
}

impl Tx {
    /// Inserts allocations in one statement and widens each resource type's longest span.
    pub async fn insert_allocations(&mut self, all: &[NewAllocation]) -> DbResult<Vec<String>> {
        self.holds_resources = true;
        let mut ids = Vec::with_capacity(all.len());
        // Bounded so that one statement stays under the backends' limits on bound values;
        // on SQLite far below them: it looks a `$N` parameter up by walking the statement's
        // list of them, at prepare and again at each bind, so a statement's cost grows with
        // the square of its parameters (500 rows of 14 were 0.5 ms a row).
        let rows = match self.backend {
            crate::Backend::Postgres => 500,
            crate::Backend::Sqlite => 32,
        };
        for chunk in all.chunks(rows) {
            let mut sql = String::from(
                "INSERT INTO allocations (id, reservation_id, lease_id, resource_type, \
                 resource_id, start_at, end_at, blocked_until, exclusive, share_key, units, vcpus, \
                 memory_mb, disk_gb) VALUES ",
            );
            let mut args: Vec<Arg> = Vec::with_capacity(chunk.len() * 14);
            for (i, new) in chunk.iter().enumerate() {
                let a = &new.occupancy;
                // Time-ordered, as the service's row ids: inserts land at the end of the
                // primary key's index, not anywhere in it.
                let id = uuid::Uuid::now_v7().to_string();
                if i > 0 {
                    sql.push_str(", ");
                }
                sql.push('(');
                sql.push_str(&crate::placeholders(args.len() + 1, 14));
                sql.push(')');
                args.extend([
                    Arg::from(&id),
                    (&new.reservation_id).into(),
                    (&new.lease_id).into(),
                    (&new.resource_type).into(),
                    new.resource_id.into(),
                    a.start.into(),
                    a.end.into(),
                    a.blocked_until.into(),
                    a.exclusive.into(),
                    share_key().into(),
                    a.units.into(),
                    a.vcpus.into(),
                    a.memory_mb.into(),
                    a.disk_gb.into(),
                ]);
                ids.push(id);
            }
            self.write(&sql, args).await?;
        }
        let spans: Vec<(&str, i64)> = all
            .iter()
            .map(|a| {
                let span = to_secs(a.occupancy.blocked_until) - to_secs(a.occupancy.start);
                (a.resource_type.as_str(), span)
            })
            .collect();
        self.widen_spans(&spans).await?;
        Ok(ids)
    }

    /// Moves the start of allocations back to when their reservation began to hold the
    /// resource (each allocation with that time): an active reservation allocated again
    /// from now on keeps the history of what it held before. Widens the longest spans as
    /// inserts do.
    pub async fn restore_allocation_starts(
        &mut self,
        starts: &[(&Allocation, DateTime<Utc>)],
    ) -> DbResult<()> {
        for (allocation, start) in starts {
            self.write(
                "UPDATE allocations SET start_at = $1 WHERE id = $2",
                vec![(*start).into(), (&allocation.id).into()],
            )
            .await?;
        }
        let spans: Vec<(&str, i64)> = starts
            .iter()
            .map(|(a, start)| {
                let span = to_secs(a.occupancy.blocked_until) - to_secs(*start);
                (a.resource_type.as_str(), span)
            })
            .collect();
        self.widen_spans(&spans).await
    }

    /// Records, per resource type, the longest `blocked_until - start` among `spans`
    /// where it is longer than any so far: range reads bound how far back they look by it.
    async fn widen_spans(&mut self, all: &[(&str, i64)]) -> DbResult<()> {
        let mut spans: Vec<(&str, i64)> = Vec::new();
        for &(resource_type, span) in all {
            match spans.iter_mut().find(|(t, _)| *t == resource_type) {
                Some((_, longest)) => *longest = (*longest).max(span),
                None => spans.push((resource_type, span)),
            }
        }
        let greatest = match self.backend {
            crate::Backend::Postgres => "GREATEST",
            crate::Backend::Sqlite => "MAX",
        };
        // Written only when the span grows: one row per resource type is shared by every
        // writer, and an update would hold its row lock to the commit, queueing concurrent
        // creates on PostgreSQL behind each other. Most leases are no longer than the
        // longest so far and leave it alone.
        for (resource_type, span) in spans {
            if self.known_spans.covers(resource_type, span) {
                continue;
            }
            self.spans_written.push((resource_type.to_string(), span));
            self.write(
                &format!(
                    "INSERT INTO allocation_spans (resource_type, max_span) SELECT $1, $2 \
                     WHERE NOT EXISTS (SELECT 1 FROM allocation_spans \
                                       WHERE resource_type = $1 AND max_span >= $2) \
                     ON CONFLICT (resource_type) DO UPDATE SET \
                     max_span = {greatest}(allocation_spans.max_span, excluded.max_span)"
                ),
                vec![resource_type.into(), span.into()],
            )
            .await?;
        }
        Ok(())
    }

    /// Sets how many slots a shared allocation holds (fewer, when some moved elsewhere).
    pub async fn set_allocation_units(&mut self, id: &str, units: i64) -> DbResult<()> {
        self.write(
            "UPDATE allocations SET units = $1 WHERE id = $2",
            vec![units.into(), id.into()],
        )
        .await
    }

    pub async fn delete_allocations_of_reservation(
        &mut self,
        reservation_id: &str,
    ) -> DbResult<()> {
        self.write(
            "DELETE FROM allocations WHERE reservation_id = $1",
            vec![reservation_id.into()],
        )
        .await
    }

    pub async fn allocations_of_lease(&mut self, lease_id: &str) -> DbResult<Vec<Allocation>> {
        self.allocations_of_leases(&[lease_id]).await
    }

    /// The allocations of several leases, each lease's by resource.
    pub async fn allocations_of_leases(&mut self, ids: &[&str]) -> DbResult<Vec<Allocation>> {
        self.fetch_all_in(
            ids,
            |list| {
                format!(
                    "SELECT {ALLOCATION_COLUMNS} FROM allocations WHERE lease_id IN ({list}) \
                     ORDER BY lease_id, resource_id"
                )
            },
            allocation_from_row,
        )
        .await
    }

    /// The index hint for reads of a list of resources' allocations near a window. SQLite,
    /// knowing nothing of the data, reads those by end time instead (every allocation
    /// ending after the window's start: all of the future at a busy site), several times
    /// slower; PostgreSQL plans from its statistics.
    pub(crate) fn by_resource_index(&self) -> &'static str {
        self.sqlite_hint(" INDEXED BY allocations_resource_span")
    }

    /// SQLite, knowing nothing of the data, is told which index reads the unended
    /// allocations; by start time it may well read every allocation that ever began.
    fn by_window_index(&self) -> &'static str {
        self.sqlite_hint(" INDEXED BY allocations_window")
    }

    /// `hint` on SQLite, which plans without statistics; nothing on PostgreSQL, which plans
    /// from its own.
    pub(crate) fn sqlite_hint(&self, hint: &'static str) -> &'static str {
        match self.backend {
            crate::Backend::Sqlite => hint,
            crate::Backend::Postgres => "",
        }
    }

    /// What the allocations of `resource_type` overlapping `[start, blocked_until)` use, in
    /// one row (a JSON array): an instance search reads every host's allocations in the
    /// window, thousands at a large site, and sqlx hands each SQLite row over on its own.
    pub async fn usage_overlapping(
        &mut self,
        resource_type: &str,
        start: DateTime<Utc>,
        blocked_until: DateTime<Utc>,
    ) -> DbResult<Vec<AllocationUsage>> {
        let (agg, array) = self.json_functions();
        let sql = format!(
            "SELECT CAST({agg}({array}(resource_id, exclusive, start_at, blocked_until, units, \
             vcpus, memory_mb, disk_gb)) AS TEXT) AS json FROM allocations \
             WHERE resource_type = $1 AND blocked_until > $2 AND start_at < $3 \
             AND start_at >= $2 - COALESCE((SELECT max_span FROM allocation_spans \
                                            WHERE resource_type = $1), 0)"
        );
        let args = vec![resource_type.into(), start.into(), blocked_until.into()];
        self.fetch_usage(&sql, args).await
    }

    /// The allocations of the resources `ids` of a type that reach into `[start, until)`,
    /// leaving out those of lease `except` (a lease asking how far it could grow). Only
    /// allocations near the window are read: the history before it costs nothing.
    pub async fn usage_among(
        &mut self,
        resource_type: &str,
        ids: &[i64],
        start: DateTime<Utc>,
        until: DateTime<Utc>,
        except: Option<&str>,
    ) -> DbResult<Vec<AllocationUsage>> {
        let (agg, array) = self.json_functions();
        let index = self.by_resource_index();
        let mut out = Vec::new();
        // Bounded statements: a request may have thousands of candidates.
        for chunk in ids.chunks(USAGE_CHUNK) {
            let (list, chunk) = crate::in_list(self.backend, 5, chunk);
            let sql = format!(
                "SELECT CAST({agg}({array}(resource_id, exclusive, start_at, blocked_until, \
                 units, vcpus, memory_mb, disk_gb)) AS TEXT) AS json FROM allocations{index} \
                 WHERE resource_type = $1 AND blocked_until > $2 AND start_at < $3 \
                 AND start_at >= $2 - COALESCE((SELECT max_span FROM allocation_spans \
                                                WHERE resource_type = $1), 0) \
                 AND lease_id <> $4 AND resource_id IN ({list})"
            );
            let mut args: Vec<Arg> = vec![
                resource_type.into(),
                start.into(),
                until.into(),
                except.unwrap_or("").into(),
            ];
            args.extend(chunk.into_iter().map(Arg::from));
            out.extend(self.fetch_usage(&sql, args).await?);
        }
        Ok(out)
    }

    async fn fetch_usage(&mut self, sql: &str, args: Vec<Arg>) -> DbResult<Vec<AllocationUsage>> {
        type Tuple = (i64, i64, i64, i64, i64, i64, i64, i64);
        let tuples: Vec<Tuple> = self.fetch_json_array(sql, args, "allocation usage").await?;
        tuples
            .into_iter()
            .map(|t| {
                Ok(AllocationUsage {
                    resource_id: t.0,
                    exclusive: t.1 != 0,
                    start: from_secs(t.2)?,
                    blocked_until: from_secs(t.3)?,
                    units: t.4,
                    vcpus: t.5,
                    memory_mb: t.6,
                    disk_gb: t.7,
                })
            })
            .collect()
    }

    /// Allocations held by a resource that have not ended by `now`, with their reservations.
    pub async fn unended_allocations_of_resource(
        &mut self,
        resource_type: &str,
        resource_id: i64,
        now: DateTime<Utc>,
    ) -> DbResult<Vec<Allocation>> {
        let sql = format!(
            "SELECT {ALLOCATION_COLUMNS} FROM allocations \
             WHERE resource_type = $1 AND resource_id = $2 AND end_at > $3 ORDER BY start_at"
        );
        let args = vec![resource_type.into(), resource_id.into(), now.into()];
        self.fetch_all_as(&sql, args, allocation_from_row).await
    }

    /// The project of the lease holding each resource of `resource_type` at `now`, by
    /// resource id (the latest to start where several do): one read for the whole pool,
    /// of the unended allocations only.
    pub async fn projects_holding_now(
        &mut self,
        resource_type: &str,
        now: DateTime<Utc>,
    ) -> DbResult<std::collections::HashMap<i64, String>> {
        let index = self.by_window_index();
        let rows = self
            .fetch_rows(
                &format!(
                    "SELECT a.resource_id, a.start_at, l.project_id FROM allocations a{index} \
                     JOIN leases l ON l.id = a.lease_id \
                     WHERE a.resource_type = $1 AND a.blocked_until > $2 \
                     AND a.end_at > $2 AND a.start_at <= $2"
                ),
                vec![resource_type.into(), now.into()],
            )
            .await?;
        let mut latest: std::collections::HashMap<i64, (i64, String)> =
            std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let (id, start): (i64, i64) = (row.try_get("resource_id")?, row.try_get("start_at")?);
            if latest.get(&id).is_none_or(|(held, _)| *held < start) {
                latest.insert(id, (start, row.try_get("project_id")?));
            }
        }
        Ok(latest
            .into_iter()
            .map(|(id, (_, project))| (id, project))
            .collect())
    }

    pub async fn delete_allocation(&mut self, id: &str) -> DbResult<()> {
        self.write("DELETE FROM allocations WHERE id = $1", vec![id.into()])
            .await
    }

    /// Everything a lease was granted, with API ids (host ids, or the uid of other resources).
    pub async fn grants_of_lease(&mut self, lease_id: &str) -> DbResult<Vec<GrantRow>> {
        let rows = sqlx::query(
            "SELECT a.reservation_id, a.resource_type, \
             COALESCE(r.uid, CAST(a.resource_id AS TEXT)) AS api_id, a.start_at, a.end_at, a.units \
             FROM allocations a LEFT JOIN resources r ON r.kind = a.resource_type AND r.id = a.resource_id \
             WHERE a.lease_id = $1 ORDER BY a.reservation_id, a.start_at, a.resource_id",
        )
        .bind(lease_id)
        .fetch_all(self.conn().await?)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(GrantRow {
                    reservation_id: row.try_get("reservation_id")?,
                    resource_type: row.try_get("resource_type")?,
                    resource_id: row.try_get("api_id")?,
                    start: from_secs(row.try_get("start_at")?)?,
                    end: from_secs(row.try_get("end_at")?)?,
                    units: row.try_get("units")?,
                })
            })
            .collect()
    }

    /// Of `ids`, the resources of `resource_type` blocked at any instant of
    /// `[start, blocked_until)`. One index probe per resource, bounded below by the longest
    /// allocation, so neither other resources nor past allocations add to its cost.
    pub async fn busy_among(
        &mut self,
        resource_type: &str,
        ids: &[i64],
        start: DateTime<Utc>,
        blocked_until: DateTime<Utc>,
    ) -> DbResult<HashSet<i64>> {
        if ids.is_empty() {
            return Ok(HashSet::new());
        }
        // Padded on PostgreSQL too: every create runs this probe two or three times with
        // lists of any length up to the batch, each length a statement of its own run too
        // rarely to be given a generic plan, so each probe was planned afresh (about 0.1 ms,
        // more than its execution). The generic plan is the custom one: an index-only scan
        // of `allocations_resource_span` with the list as an array.
        let (list, ids) = crate::padded_list(true, 4, ids);
        let sql = format!(
            "SELECT DISTINCT resource_id FROM allocations{} \
             WHERE resource_type = $1 AND resource_id IN ({list}) AND blocked_until > $2 \
             AND start_at < $3 AND start_at >= $2 - COALESCE((SELECT max_span FROM \
             allocation_spans WHERE resource_type = $1), 0)",
            self.by_resource_index(),
        );
        let mut args: Vec<Arg> = vec![resource_type.into(), start.into(), blocked_until.into()];
        args.extend(ids.into_iter().map(Arg::from));
        let rows = self.fetch_rows(&sql, args).await?;
        rows.iter().map(|r| Ok(r.try_get("resource_id")?)).collect()
    }

    /// Allocations joined with their lease dates. With neither `lease_id` nor `reservation_id`
    /// only leases that have not ended by `now` are shown, as Blazar does.
    pub async fn allocation_views(
        &mut self,
        resource_type: &str,
        resource_id: Option<i64>,
        lease_id: Option<&str>,
        reservation_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> DbResult<Vec<AllocationView>> {
        let unfiltered = lease_id.is_none() && reservation_id.is_none();
        self.allocation_views_where(
            resource_type,
            &AllocationFilter {
                resources: resource_id.map(|id| (id, id)),
                lease_id: lease_id.map(str::to_string),
                reservation_id: reservation_id.map(str::to_string),
                ends_after: unfiltered.then_some(now),
                starts_before: None,
            },
        )
        .await
    }

    /// The allocations of `resource_type` that `filter` lets through, joined with their
    /// lease dates, sorted by resource, start and reservation.
    pub async fn allocation_views_where(
        &mut self,
        resource_type: &str,
        filter: &AllocationFilter,
    ) -> DbResult<Vec<AllocationView>> {
        self.read_allocation_views(resource_type, filter, false)
            .await
    }

    /// What [`Tx::allocation_views_where`] returns for every resource of `resource_type`
    /// at once, read by time, when `filter` is a window bounded on both sides that holds at
    /// most `at_most` allocations; `None` when it holds more, or the filter is not such a
    /// window (or names a lease, a reservation or resources), for the caller to read by
    /// resource in batches.
    ///
    /// Read by resource, a window costs every allocation of the resources read, before it
    /// and after it: a week's window of a year at 10,000 hosts scanned all 100,000 in ten
    /// batches. No allocation lasts longer than its type's longest span, so one that reaches
    /// into the window began at most that long before it: read by start time, the same week
    /// is the month or so of allocations around it, counted first so that a wide window
    /// (a year) goes back to batches instead of being held in memory.
    pub async fn allocation_views_in_window(
        &mut self,
        resource_type: &str,
        filter: &AllocationFilter,
        at_most: usize,
    ) -> DbResult<Option<Vec<AllocationView>>> {
        let (Some(start), Some(end)) = (filter.ends_after, filter.starts_before) else {
            return Ok(None);
        };
        if filter.resources.is_some()
            || filter.lease_id.is_some()
            || filter.reservation_id.is_some()
        {
            return Ok(None);
        }
        let count = format!(
            "SELECT COUNT(*) AS n FROM (SELECT 1 FROM allocations a{index} \
             WHERE a.resource_type = $1 AND a.blocked_until > $2 AND a.start_at < $3{since} \
             LIMIT $4) w",
            index = self.by_start_index(),
            since = SINCE_LONGEST_SPAN.replace("$?", "$2")
        );
        let over = i64::try_from(at_most).unwrap_or(i64::MAX).saturating_add(1);
        let held: i64 = self
            .fetch_rows(
                &count,
                vec![resource_type.into(), start.into(), end.into(), over.into()],
            )
            .await?
            .first()
            .map(|row| row.try_get("n"))
            .transpose()?
            .unwrap_or(0);
        if held >= over {
            return Ok(None);
        }
        Ok(Some(
            self.read_allocation_views(resource_type, filter, true)
                .await?,
        ))
    }

    /// SQLite, knowing nothing of the data, is told which index reads by start time.
    fn by_start_index(&self) -> &'static str {
        self.sqlite_hint(" INDEXED BY allocations_start")
    }

    /// The read of [`Tx::allocation_views_where`]; `by_time` bounds it below by the
    /// window's start less the longest span, so that it reads by start time.
    async fn read_allocation_views(
        &mut self,
        resource_type: &str,
        filter: &AllocationFilter,
        by_time: bool,
    ) -> DbResult<Vec<AllocationView>> {
        let mut sql = match self.backend {
            // One row of JSON (sqlx hands SQLite rows from the connection's thread to the
            // task one at a time, so one row per allocation was mostly thread switches), of
            // one entry per reservation with its resources as text, as on PostgreSQL: a
            // lease of a rack is one entry, not a hundred with its two ids each. The
            // allocations are read from `allocations_resource_span` alone, which carries
            // the reservation; its lease is read once per reservation.
            Backend::Sqlite => "SELECT CAST(json_group_array(json_array(g.reservation_id, \
                 l.id, l.start_at, l.end_at, g.resources)) AS TEXT) AS json \
                 FROM (SELECT a.reservation_id, group_concat(a.resource_id) AS resources"
                .to_string(),
            // PostgreSQL hands rows over a socket, not between threads, but sqlx's `Any`
            // driver converts every row with its column descriptions: a row per
            // reservation with its resources as text (a lease of a rack is one row, not
            // a hundred) spares most of that, and the JSON text both sides would build.
            // Only the resource and its reservation are read from the allocations, both in
            // `allocations_resource_span`, so that a vacuumed table is read from the index
            // alone; the lease comes through the reservation.
            Backend::Postgres => "SELECT g.reservation_id, l.lease_id, l.start_at, l.end_at, \
                 g.resources FROM (SELECT a.reservation_id, \
                 string_agg(CAST(a.resource_id AS TEXT), ',') AS resources"
                .to_string(),
        };
        sql.push_str(" FROM allocations a");
        if by_time {
            sql.push_str(self.by_start_index());
        }
        sql.push_str(" WHERE a.resource_type = $1");
        let mut args: Vec<Arg> = vec![resource_type.into()];
        let mut condition = |sql: &mut String, clause: &str, arg: Arg| {
            args.push(arg);
            sql.push_str(&clause.replace("$?", &format!("${}", args.len())));
        };
        if let Some(lease) = &filter.lease_id {
            condition(&mut sql, " AND a.lease_id = $?", lease.clone().into());
        }
        if let Some(reservation) = &filter.reservation_id {
            condition(
                &mut sql,
                " AND a.reservation_id = $?",
                reservation.clone().into(),
            );
        }
        if let Some((first, last)) = filter.resources {
            if first == last {
                condition(&mut sql, " AND a.resource_id = $?", first.into());
            } else {
                condition(&mut sql, " AND a.resource_id >= $?", first.into());
                condition(&mut sql, " AND a.resource_id <= $?", last.into());
            }
        }
        if let Some(t) = filter.ends_after {
            // The window is the lease's (checked below), but an allocation is never blocked
            // for less than its lease runs (a lease whose dates move gets new allocations),
            // so one blocked only until `t` belongs to a lease that ended by then: leaving
            // it out here keeps years of finished allocations out of the read, from the
            // index alone.
            condition(&mut sql, " AND a.blocked_until > $?", t.into());
            if by_time {
                condition(&mut sql, SINCE_LONGEST_SPAN, t.into());
            }
        }
        if let Some(t) = filter.starts_before {
            // An allocation that begins at or after the window's end is not held in it: its
            // lease may have begun before (a replacement healing made later), but the
            // resource was not the lease's then. Left out here, from the index alone, a
            // week's window early in a busy year no longer groups and joins the whole
            // year's allocations only to drop them by their lease below.
            condition(&mut sql, " AND a.start_at < $?", t.into());
        }
        // Each reservation's group, then its reservation and lease by key (read once per
        // reservation, not per allocation; a lease outside the window, or one gone since,
        // leaves its allocations out). SQLite: `CROSS JOIN` keeps its join order, the
        // batch's groups first. PostgreSQL: a lateral read, whose text is the same for
        // every batch, so each connection prepares it once.
        sql.push_str(match self.backend {
            Backend::Sqlite => {
                " GROUP BY a.reservation_id) g CROSS JOIN reservations r \
                 CROSS JOIN leases l WHERE r.id = g.reservation_id AND l.id = r.lease_id"
            }
            Backend::Postgres => {
                " GROUP BY a.reservation_id) g CROSS JOIN LATERAL \
                 (SELECT l.id AS lease_id, l.start_at, l.end_at FROM reservations r \
                 JOIN leases l ON l.id = r.lease_id WHERE r.id = g.reservation_id"
            }
        });
        if let Some(t) = filter.ends_after {
            // Half-open windows: a lease ending at T is over at T.
            condition(&mut sql, " AND l.end_at > $?", t.into());
        }
        if let Some(t) = filter.starts_before {
            condition(&mut sql, " AND l.start_at < $?", t.into());
        }
        let groups: Vec<Group> = match self.backend {
            Backend::Sqlite => self.fetch_json_array(&sql, args, "allocations").await?,
            Backend::Postgres => {
                // `OFFSET 0` keeps the planner from flattening the lateral read into a join:
                // it cannot know a batch holds a few dozen reservations, and as a join it
                // hashed every lease of the table for each batch.
                sql.push_str(" OFFSET 0) l");
                self.fetch_all_as(&sql, args, |row| {
                    Ok((
                        row.try_get("reservation_id")?,
                        row.try_get("lease_id")?,
                        row.try_get("start_at")?,
                        row.try_get("end_at")?,
                        row.try_get("resources")?,
                    ))
                })
                .await?
            }
        };
        views_of_groups(groups)
    }

    /// The latest time in `(after, until]` at which some allocation stopped blocking its
    /// resource: a lease ended early in the minute a `now` lease would start from. Reads the
    /// window index for each resource type that has allocations.
    pub async fn last_release_between(
        &mut self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> DbResult<Option<DateTime<Utc>>> {
        let row = sqlx::query(
            "SELECT CAST(MAX((SELECT MAX(a.blocked_until) FROM allocations a \
                              WHERE a.resource_type = s.resource_type \
                              AND a.blocked_until > $1 AND a.blocked_until <= $2)) AS BIGINT) \
             AS t FROM allocation_spans s",
        )
        .bind(to_secs(after))
        .bind(to_secs(until))
        .fetch_one(self.conn().await?)
        .await?;
        let t: Option<i64> = row.try_get("t")?;
        t.map(from_secs).transpose()
    }

    /// The latest time in `(after, until]` at which another lease's allocation stopped
    /// blocking a resource lease `lease_id` holds: how far back into the minute a `now`
    /// lease may start once it knows what it was granted.
    pub async fn last_release_on_lease_resources(
        &mut self,
        lease_id: &str,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> DbResult<Option<DateTime<Utc>>> {
        let row = sqlx::query(
            "SELECT CAST(MAX(a.blocked_until) AS BIGINT) AS t \
             FROM allocations mine JOIN allocations a \
               ON a.resource_type = mine.resource_type AND a.resource_id = mine.resource_id \
             WHERE mine.lease_id = $1 AND a.lease_id <> $1 \
             AND a.blocked_until > $2 AND a.blocked_until <= $3",
        )
        .bind(lease_id)
        .bind(to_secs(after))
        .bind(to_secs(until))
        .fetch_one(self.conn().await?)
        .await?;
        let t: Option<i64> = row.try_get("t")?;
        t.map(from_secs).transpose()
    }

    /// Whether the resource is held by an allocation still blocked at or after `now`.
    pub async fn has_unended_allocation(
        &mut self,
        resource_type: &str,
        resource_id: i64,
        now: DateTime<Utc>,
    ) -> DbResult<bool> {
        let row = sqlx::query(
            "SELECT 1 AS x FROM allocations WHERE resource_type = $1 AND resource_id = $2 \
             AND blocked_until > $3 LIMIT 1",
        )
        .bind(resource_type)
        .bind(resource_id)
        .bind(to_secs(now))
        .fetch_optional(self.conn().await?)
        .await?;
        Ok(row.is_some())
    }

    /// Hosts holding instance slots (shared allocations) still blocked at or after `now`,
    /// by id: what a change of the default allocation ratios may leave over capacity. Reads
    /// only the unended part of the window index.
    pub async fn hosts_holding_slots(
        &mut self,
        host_type: &str,
        now: DateTime<Utc>,
    ) -> DbResult<Vec<i64>> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "SELECT DISTINCT resource_id FROM allocations WHERE resource_type = $1 \
             AND blocked_until > $2 AND exclusive = 0 ORDER BY resource_id",
        )
        .bind(host_type)
        .bind(to_secs(now))
        .fetch_all(self.conn().await?)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// Forgets the past allocations of a resource that is being removed from the inventory.
    pub async fn delete_allocations_of_resource(
        &mut self,
        resource_type: &str,
        resource_id: i64,
    ) -> DbResult<()> {
        sqlx::query("DELETE FROM allocations WHERE resource_type = $1 AND resource_id = $2")
            .bind(resource_type)
            .bind(resource_id)
            .execute(self.conn().await?)
            .await?;
        Ok(())
    }

    /// Opens the hand-over of a resource to a reservation. One still open keeps its start:
    /// a host handed over again (given more instance slots) has been held all along. One
    /// that ended stays on record as it was, and a new period begins.
    pub async fn start_handover(&mut self, h: &Handover) -> DbResult<()> {
        sqlx::query(
            "INSERT INTO handovers (id, resource_type, resource_id, project_id, lease_id, \
             reservation_id, started_at, ended_at) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL) \
             ON CONFLICT (reservation_id, resource_type, resource_id) WHERE ended_at IS NULL \
             DO UPDATE SET project_id = excluded.project_id",
        )
        .bind(uuid::Uuid::now_v7().to_string())
        .bind(&h.resource_type)
        .bind(h.resource_id)
        .bind(&h.project_id)
        .bind(&h.lease_id)
        .bind(&h.reservation_id)
        .bind(to_secs(h.started_at))
        .execute(self.conn().await?)
        .await?;
        Ok(())
    }

    /// Ends the open hand-overs of a reservation (all of its resources, or one).
    pub async fn end_handovers(
        &mut self,
        reservation_id: &str,
        resource_id: Option<i64>,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        let mut sql = String::from(
            "UPDATE handovers SET ended_at = $1 WHERE reservation_id = $2 AND ended_at IS NULL",
        );
        if resource_id.is_some() {
            sql.push_str(" AND resource_id = $3");
        }
        let mut query = sqlx::query(&sql).bind(to_secs(now)).bind(reservation_id);
        if let Some(id) = resource_id {
            query = query.bind(id);
        }
        query.execute(self.conn().await?).await?;
        Ok(())
    }

    /// A page of the hand-overs `filter` selects, in the list's order (type, resource,
    /// start), after `after`: each with its place, from which the next page goes on.
    pub async fn handovers_page(
        &mut self,
        filter: &HandoverFilter,
        after: Option<&HandoverPlace>,
        limit: usize,
    ) -> DbResult<Vec<(HandoverPlace, ListedHandover)>> {
        let (sql, args) = handovers_query(filter, after, limit);
        let rows = self.fetch_rows(&sql, args).await?;
        rows.iter()
            .map(|row| {
                let handover = Handover {
                    resource_type: row.try_get("resource_type")?,
                    resource_id: row.try_get("resource_id")?,
                    project_id: row.try_get("project_id")?,
                    lease_id: row.try_get("lease_id")?,
                    reservation_id: row.try_get("reservation_id")?,
                    started_at: from_secs(row.try_get("started_at")?)?,
                    ended_at: from_opt_secs(row.try_get("ended_at")?)?,
                };
                let place = HandoverPlace {
                    resource_type: handover.resource_type.clone(),
                    resource_id: handover.resource_id,
                    started_at: handover.started_at,
                    id: row.try_get("id")?,
                };
                let listed = ListedHandover {
                    handover,
                    api_id: row.try_get("api_id")?,
                };
                Ok((place, listed))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plans::{plan, scratch_store};

    /// SQLite's plan of a page of hand-overs after the first: a range of the listing index
    /// from the last place on, in the list's order (no sort of the whole history), whether
    /// or not the page is one project's.
    #[tokio::test]
    async fn a_page_of_hand_overs_is_an_index_range_on_sqlite() {
        let (_dir, store) = scratch_store().await;
        let mut tx = store.read().await.unwrap();
        let place = HandoverPlace {
            resource_type: "physical:host".into(),
            resource_id: 7,
            started_at: crate::from_secs(1_900_000_000).unwrap(),
            id: "x".into(),
        };
        for project_id in [None, Some("alpha".to_string())] {
            let filter = HandoverFilter {
                project_id,
                include_ended: true,
                ..HandoverFilter::default()
            };
            let (sql, args) = handovers_query(&filter, Some(&place), 1000);
            let plan = plan(&mut tx, &sql, args).await;
            assert!(
                plan.iter()
                    .any(|d| d.starts_with("SEARCH h USING INDEX handovers_listing")),
                "{plan:?}"
            );
            assert!(!plan.iter().any(|d| d.contains("TEMP B-TREE")), "{plan:?}");
        }
        tx.commit().await.unwrap();
        store.close().await;
    }
}
