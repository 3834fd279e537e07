//! The allocations a timeline shows: those of one resource type overlapping a window, with
//! their lease's name, project and status, read in one round trip.

use blazar_core::{LeaseStatus, Occupancy};
use chrono::{DateTime, Utc};

use crate::{Arg, DbResult, Tx, from_secs, wire};

/// One allocation overlapping the window, with its lease.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineRow {
    pub resource_id: i64,
    pub occupancy: Occupancy,
    pub reservation_id: String,
    pub lease_id: String,
    pub lease_name: String,
    pub project_id: String,
    pub status: LeaseStatus,
    pub degraded: bool,
}

type Tuple = (
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    String,
    String,
    String,
    String,
    String,
    i64,
);

impl Tx {
    /// The statement of [`Tx::timeline_allocations`] and its arguments.
    fn timeline_query(
        &self,
        resource_type: &str,
        ids: &[i64],
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> (String, Vec<Arg>) {
        let (agg, array) = self.json_functions();
        // SQLite, knowing nothing of the data, would read by end time (everything after the
        // window's start); one probe of the per-resource index each is right, so it is
        // named. PostgreSQL plans from its statistics.
        let index = match self.backend {
            crate::Backend::Postgres => "",
            crate::Backend::Sqlite => self.by_resource_index(),
        };
        let mut sql = format!(
            "SELECT CAST({agg}({array}(a.resource_id, a.start_at, a.end_at, a.blocked_until, \
             a.exclusive, a.units, a.vcpus, a.memory_mb, a.disk_gb, a.reservation_id, \
             a.lease_id, l.name, l.project_id, l.status, l.degraded)) AS TEXT) AS json \
             FROM allocations a{index} JOIN leases l ON l.id = a.lease_id \
             WHERE a.resource_type = $1 AND a.blocked_until > $2 AND a.start_at < $3 \
             AND a.start_at >= $2 - COALESCE((SELECT max_span FROM allocation_spans \
                                              WHERE resource_type = $1), 0)"
        );
        let mut args: Vec<Arg> = vec![resource_type.into(), start.into(), end.into()];
        match (self.backend, ids.iter().min(), ids.iter().max()) {
            // PostgreSQL plans a long IN list as barely selective, and reads the whole
            // window by start for each batch; bounded by the ids' range it picks the index
            // that suits the range's share of the resources. Resources in the range that are
            // not asked for (a property query's gaps) are dropped by the caller.
            (crate::Backend::Postgres, Some(first), Some(last)) => {
                sql.push_str(" AND a.resource_id >= $4 AND a.resource_id <= $5");
                args.extend([Arg::from(*first), Arg::from(*last)]);
            }
            _ => {
                let (list, ids) = crate::in_list(self.backend, 4, ids);
                sql.push_str(&format!(" AND a.resource_id IN ({list})"));
                args.extend(ids.into_iter().map(Arg::from));
            }
        }
        (sql, args)
    }

    /// The allocations of the resources `ids` (internal ids) of `resource_type` blocked at
    /// any instant of `[start, end)`, ordered by resource then start; on PostgreSQL, those of
    /// every resource between the least and the greatest of `ids`. One row in all (a JSON array), since
    /// sqlx hands each SQLite row over on its own; the scan is bounded below by the type's
    /// longest allocation, so the history before the window is never read.
    pub async fn timeline_allocations(
        &mut self,
        resource_type: &str,
        ids: &[i64],
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> DbResult<Vec<TimelineRow>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (sql, args) = self.timeline_query(resource_type, ids, start, end);
        let tuples: Vec<Tuple> = self
            .fetch_json_array(&sql, args, "timeline allocations")
            .await?;
        let mut rows = tuples
            .into_iter()
            .map(|t| {
                Ok(TimelineRow {
                    resource_id: t.0,
                    occupancy: Occupancy {
                        start: from_secs(t.1)?,
                        end: from_secs(t.2)?,
                        blocked_until: from_secs(t.3)?,
                        exclusive: t.4 != 0,
                        units: t.5,
                        vcpus: t.6,
                        memory_mb: t.7,
                        disk_gb: t.8,
                    },
                    reservation_id: t.9,
                    lease_id: t.10,
                    lease_name: t.11,
                    project_id: t.12,
                    status: wire(&t.13, "lease status")?,
                    degraded: t.14 != 0,
                })
            })
            .collect::<DbResult<Vec<_>>>()?;
        // Sorted here rather than by the database: an aggregate's order is not the query's
        // on both backends, and a sort of the window's rows is cheap.
        rows.sort_unstable_by(|a, b| {
            (a.resource_id, a.occupancy.start, &a.reservation_id).cmp(&(
                b.resource_id,
                b.occupancy.start,
                &b.reservation_id,
            ))
        });
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plans::{plan, scratch_store};

    /// SQLite's plan of a timeline read: the allocations come from an index range bounded
    /// by start per resource, never from every allocation ending later.
    #[tokio::test]
    async fn timeline_reads_search_an_index_on_sqlite() {
        let (_dir, store) = scratch_store().await;
        let mut tx = store.read().await.unwrap();
        let t = from_secs(1_900_000_000).unwrap();
        let (sql, args) = tx.timeline_query("physical:host", &[1, 2, 3], t, t);
        let plan = plan(&mut tx, &sql, args).await;
        let allocations: Vec<&String> =
            plan.iter().filter(|d| d.starts_with("SEARCH a ")).collect();
        assert_eq!(
            allocations,
            [
                "SEARCH a USING INDEX allocations_resource_span (resource_type=? AND \
                 resource_id=? AND start_at>? AND start_at<?)"
            ],
            "{plan:?}"
        );
        tx.commit().await.unwrap();
        store.close().await;
    }
}
