//! Occupancy timelines (`GET /v1/<resources>/timeline`): every resource of a type (or those
//! matching a property query), a page at a time, with the allocations that overlap a
//! window, read a batch of resources at a time so that the answer can be streamed. For users' calendars, so any authenticated caller may ask; whose leases they are
//! is shown to admins and to the lease's own project only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use blazar_core::engine::Usage;
use blazar_core::timeline::timeline_window;
use blazar_core::{
    BusyInterval, Holder, Holding, PHYSICAL_HOST, PropertyQuery, ResourceTimeline, TimeWindow, When,
};
use blazar_db::{TimelineRow, Tx};

use crate::allocation_list::{BATCH, FIRST_BATCH, next_batch_size};

/// Resources read per batch of a timeline at most on PostgreSQL. A timeline is sparse (only
/// the window), and there a batch costs some milliseconds beyond its rows (planning, a round
/// trip, the join): 40 batches of 250 made a month of 10,000 hosts twice as slow as one read,
/// so batches grow to about `Settings::list_batch_allocations` intervals. SQLite probes the
/// index once per resource of a batch's `IN` list, which grows slower per resource with the
/// list's length (a month of 10,000 hosts: 64 ms in batches of 250, 96 ms growing to
/// 10,000), so it keeps the allocation list's batches.
const POSTGRES_BATCH: usize = 10_000;
use crate::instance::Ratios;
use crate::resources::Inventory;

use crate::pool::{DEVICE, FLOATINGIP, NETWORK};
use crate::resources::{UnknownProperty, check_known_properties};
use crate::{Identity, Service, ServiceError, ServiceResult};

/// The policy rule of every timeline.
pub const TIMELINE_RULE: &str = "blazar:timeline:get";

/// What a timeline request asks for, as parsed from its query string.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TimelineRequest {
    pub start: Option<When>,
    pub end: Option<When>,
    /// A property query in the language of `resource_properties`.
    pub query: Option<String>,
    /// At most this many resources (all when absent).
    pub limit: Option<usize>,
    /// The API id of the last resource of the previous page.
    pub marker: Option<String>,
}

/// A timeline being read: the page of resources, in order, whose allocations are read a
/// batch of resources at a time, each batch in a short read transaction of its own (as
/// the allocation list is), so that a month of every host is never whole in memory,
/// however many calendars ask at once.
pub struct TimelineReader {
    service: Service,
    resource_type: &'static str,
    /// Whose intervals show their lease (with `admin`).
    project_id: String,
    admin: bool,
    pub window: TimeWindow,
    page: Page,
    /// Resources of the page read so far.
    done: usize,
    /// Resources the next batch takes, and at most.
    batch: usize,
    cap: usize,
    /// The marker of the next page, when the limit cut the page.
    pub next_marker: Option<String>,
}

/// The timelines of one batch of resources, holding its permit of the large reads until
/// dropped: the caller renders it first, so that what is in memory at once, read or being
/// rendered, is bounded however many clients read.
pub struct TimelineBatch {
    pub resources: Vec<ResourceTimeline>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl TimelineReader {
    /// The next batch of resources with their intervals, in order; `None` once all are read.
    pub async fn next_batch(&mut self) -> ServiceResult<Option<TimelineBatch>> {
        let batch = self.page.candidates(self.done, self.batch);
        self.done += self.batch;
        if batch.is_empty() {
            return Ok(None);
        }
        let service = &self.service;
        let permit = service.large_read_permit().await?;
        let keys: Vec<i64> = batch.iter().map(|c| c.key).collect();
        let (start, end) = (self.window.start(), self.window.end());
        let rows = in_tx!(service, read, |tx| {
            Ok(tx
                .timeline_allocations(self.resource_type, &keys, start, end)
                .await?)
        })?;
        let mut held = 0;
        let mut by_resource: HashMap<i64, Vec<BusyInterval>> =
            keys.iter().map(|k| (*k, Vec::new())).collect();
        // Rows of resources in the batch's range but not on the page go (PostgreSQL reads by
        // range).
        for row in rows {
            let Some(busy) = by_resource.get_mut(&row.resource_id) else {
                continue;
            };
            busy.push(busy_interval(row, &self.project_id, self.admin));
            held += 1;
        }
        self.batch = next_batch_size(
            batch.len(),
            held,
            service.settings.list_batch_allocations,
            self.cap,
        );
        let resources = batch
            .into_iter()
            .map(|c| ResourceTimeline {
                busy: by_resource.remove(&c.key).unwrap_or_default(),
                id: c.id,
                name: c.name,
                reservable: c.reservable,
                instance_capacity: c.capacity,
            })
            .collect();
        Ok(Some(TimelineBatch {
            resources,
            _permit: permit,
        }))
    }
}

/// The resources of a timeline's page, in id order. Hosts are held as their ids in the
/// inventory snapshot they were chosen from, and made into candidates a batch at a time:
/// a reader then holds a few bytes a host, however many read at once.
enum Page {
    Hosts {
        inventory: Arc<Inventory>,
        ratios: Ratios,
        ids: Vec<i64>,
    },
    /// Floating IPs, segments and devices: few, held whole.
    Pool(Vec<Candidate>),
}

impl Page {
    /// Keeps the resources after the one of internal id `key`.
    fn keep_after(&mut self, key: i64) {
        match self {
            Page::Hosts { ids, .. } => ids.retain(|id| *id > key),
            Page::Pool(candidates) => candidates.retain(|c| c.key > key),
        }
    }

    /// Cuts the page to `limit` resources; the API id of the last one kept when some were
    /// cut (the next page's marker).
    fn cut(&mut self, limit: usize) -> Option<String> {
        match self {
            Page::Hosts { ids, .. } if ids.len() > limit => {
                ids.truncate(limit);
                ids.last().map(i64::to_string)
            }
            Page::Pool(candidates) if candidates.len() > limit => {
                candidates.truncate(limit);
                candidates.last().map(|c| c.id.clone())
            }
            _ => None,
        }
    }

    /// The candidates of the page's resources `from..from + count`.
    fn candidates(&self, from: usize, count: usize) -> Vec<Candidate> {
        let range = |len: usize| from.min(len)..from.saturating_add(count).min(len);
        match self {
            Page::Hosts {
                inventory,
                ratios,
                ids,
            } => ids[range(ids.len())]
                .iter()
                .filter_map(|id| inventory.get(*id))
                .map(|h| Candidate {
                    key: h.id,
                    id: h.id.to_string(),
                    name: h.facts.hypervisor_hostname.clone(),
                    reservable: h.reservable,
                    capacity: Some(crate::instance::capacity(h, *ratios)),
                })
                .collect(),
            Page::Pool(candidates) => candidates[range(candidates.len())].to_vec(),
        }
    }
}

/// A resource that made it onto the page, before its allocations are read.
#[derive(Clone)]
struct Candidate {
    key: i64,
    id: String,
    name: String,
    reservable: bool,
    capacity: Option<Usage>,
}

/// The pool kind in messages (as allocation's refusals word it).
fn noun(kind: &str) -> &'static str {
    match kind {
        FLOATINGIP => "floating IP",
        NETWORK => "network segment",
        _ => "device",
    }
}

/// The capability maps as a caller who may not see `private` properties knows them.
fn public_capabilities<'a>(
    all: impl Iterator<Item = &'a BTreeMap<String, String>>,
    private: &HashSet<String>,
) -> Vec<BTreeMap<String, String>> {
    all.map(|c| {
        c.iter()
            .filter(|(k, _)| !private.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
    .collect()
}

impl Service {
    /// The properties a calendar may group the timeline of `resource_type` by, with their
    /// values: under the timeline's rule, so members (who may not list the inventory's
    /// properties in Blazar's policy) can group what they see; private ones for admins only.
    pub async fn timeline_properties(
        &self,
        identity: &Identity,
        resource_type: &str,
    ) -> ServiceResult<crate::PropertyListing> {
        if ![PHYSICAL_HOST, FLOATINGIP, NETWORK, DEVICE].contains(&resource_type) {
            return Err(ServiceError::NotFound(format!(
                "No timeline for resource type {resource_type}"
            )));
        }
        let admin = self.is_admin(identity);
        self.list_properties(identity, TIMELINE_RULE, resource_type, true, admin)
            .await
    }

    /// Starts reading the timeline of `resource_type` (`physical:host`,
    /// `virtual:floatingip`, `network`, `device`) for `identity`: checks the caller and the
    /// request and takes the page of resources; their allocations are read a batch at a
    /// time by [`TimelineReader::next_batch`].
    pub async fn timeline(
        &self,
        identity: &Identity,
        resource_type: &str,
        request: &TimelineRequest,
    ) -> ServiceResult<TimelineReader> {
        self.authorize_own(TIMELINE_RULE, identity)?;
        let Some(resource_type) = [PHYSICAL_HOST, FLOATINGIP, NETWORK, DEVICE]
            .into_iter()
            .find(|t| *t == resource_type)
        else {
            return Err(ServiceError::NotFound(format!(
                "No timeline for resource type {resource_type}"
            )));
        };
        let window = timeline_window(self.now(), request.start, request.end)
            .map_err(ServiceError::BadRequest)?;
        let query = match request.query.as_deref() {
            Some(text) => PropertyQuery::parse(text).map_err(|e| {
                ServiceError::BadRequest(format!("Malformed parameter query {text}: {e}"))
            })?,
            None => None,
        };
        if request.limit == Some(0) {
            return Err(ServiceError::BadRequest(
                "Malformed parameter limit: must be a positive integer".into(),
            ));
        }
        let admin = self.is_admin(identity);
        let (page, next_marker) = in_tx!(self, read, |tx| {
            // A non-admin's query may not name a private property: which resources match
            // would tell its values. It reads as a property nobody has.
            let private = match &query {
                Some(q) if !admin => {
                    let private = tx.private_property_names(resource_type).await?;
                    if q.keys().iter().any(|k| private.contains(*k)) {
                        private
                    } else {
                        HashSet::new()
                    }
                }
                _ => HashSet::new(),
            };
            let mut page = if resource_type == PHYSICAL_HOST {
                self.host_page(tx, query.as_ref(), &private).await?
            } else {
                Page::Pool(pool_candidates(tx, resource_type, query.as_ref(), &private).await?)
            };
            if let Some(marker) = &request.marker {
                page.keep_after(self.marker_key(tx, resource_type, marker).await?);
            }
            let next_marker = request.limit.and_then(|limit| page.cut(limit));
            Ok((page, next_marker))
        })?;
        Ok(TimelineReader {
            service: self.clone(),
            resource_type,
            project_id: identity.project_id.clone(),
            admin,
            window,
            page,
            done: 0,
            batch: FIRST_BATCH,
            cap: match self.store.backend() {
                blazar_db::Backend::Postgres => POSTGRES_BATCH,
                blazar_db::Backend::Sqlite => BATCH,
            },
            next_marker,
        })
    }

    /// Hosts matching `query` (non-reservable ones included: a calendar shades them), in id
    /// order.
    async fn host_page(
        &self,
        tx: &mut Tx,
        query: Option<&PropertyQuery>,
        private: &HashSet<String>,
    ) -> ServiceResult<Page> {
        let inventory = self.host_cache.inventory(tx).await?;
        if let Some(q) = query {
            let known = if private.is_empty() {
                check_known_properties(
                    "query",
                    q,
                    blazar_core::HostRecord::is_column,
                    inventory.hosts.iter().map(|h| &h.capabilities),
                    "host",
                )
            } else {
                let public =
                    public_capabilities(inventory.hosts.iter().map(|h| &h.capabilities), private);
                check_known_properties(
                    "query",
                    q,
                    blazar_core::HostRecord::is_column,
                    public.iter(),
                    "host",
                )
            };
            if let Err(unknown) = known {
                return Err(unknown.into_error(tx, PHYSICAL_HOST).await);
            }
        }
        let mut ids: Vec<i64> = inventory
            .hosts
            .iter()
            .filter(|h| {
                let lookup = |k: &str| h.property(k);
                query.is_none_or(|q| q.matches(&lookup))
            })
            .map(|h| h.id)
            .collect();
        ids.sort_unstable();
        Ok(Page::Hosts {
            inventory,
            ratios: self.settings.ratios,
            ids,
        })
    }

    /// The internal id of the resource `marker` names; a marker that names no resource of
    /// the type is refused, as a page cannot be placed after it.
    async fn marker_key(
        &self,
        tx: &mut Tx,
        resource_type: &str,
        marker: &str,
    ) -> ServiceResult<i64> {
        let not_found = || ServiceError::BadRequest(format!("Marker {marker} not found"));
        if resource_type == PHYSICAL_HOST {
            let id: i64 = marker.parse().map_err(|_| not_found())?;
            let inventory = self.host_cache.inventory(tx).await?;
            Ok(inventory.get(id).ok_or_else(not_found)?.id)
        } else {
            Ok(tx
                .get_resource(resource_type, marker)
                .await?
                .ok_or_else(not_found)?
                .id)
        }
    }
}

/// Floating IPs, network segments or devices matching `query`, in the order the list shows
/// them (registration order).
async fn pool_candidates(
    tx: &mut Tx,
    kind: &str,
    query: Option<&PropertyQuery>,
    private: &HashSet<String>,
) -> ServiceResult<Vec<Candidate>> {
    let pool = tx.list_resources(kind).await?;
    if let Some(q) = query {
        let columns = crate::pool::columns(kind);
        let is_column = |k: &str| columns.contains(&k);
        let known: Result<(), UnknownProperty> = if private.is_empty() {
            check_known_properties(
                "query",
                q,
                is_column,
                pool.iter().map(|r| &r.resource.capabilities),
                noun(kind),
            )
        } else {
            let public =
                public_capabilities(pool.iter().map(|r| &r.resource.capabilities), private);
            check_known_properties("query", q, is_column, public.iter(), noun(kind))
        };
        if let Err(unknown) = known {
            return Err(unknown.into_error(tx, kind).await);
        }
    }
    let mut candidates: Vec<Candidate> = pool
        .iter()
        .filter(|r| {
            let lookup = |k: &str| crate::pool::property(r, k);
            query.is_none_or(|q| q.matches(&lookup))
        })
        .map(|r| Candidate {
            key: r.id,
            id: r.resource.uid.clone(),
            name: r.resource.display_name(),
            reservable: r.resource.reservable,
            capacity: None,
        })
        .collect();
    candidates.sort_by_key(|c| c.key);
    Ok(candidates)
}

/// One allocation as `identity` may see it: whose lease it is only for an admin or the
/// lease's own project.
fn busy_interval(row: TimelineRow, project_id: &str, admin: bool) -> BusyInterval {
    let own = row.project_id == project_id;
    let holder = (admin || own).then_some(Holder {
        lease_id: row.lease_id,
        lease_name: row.lease_name,
        project_id: row.project_id,
        reservation_id: row.reservation_id,
    });
    let holding = if row.occupancy.exclusive {
        Holding::Whole
    } else {
        Holding::Slots {
            units: row.occupancy.units,
            size: Usage {
                vcpus: row.occupancy.vcpus,
                memory_mb: row.occupancy.memory_mb,
                disk_gb: row.occupancy.disk_gb,
            },
        }
    };
    BusyInterval {
        start: row.occupancy.start,
        end: row.occupancy.end,
        blocked_until: row.occupancy.blocked_until,
        status: row.status,
        degraded: row.degraded,
        own,
        holder,
        holding,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_projects_intervals_hide_whose_they_are() {
        let t = chrono::DateTime::from_timestamp(1_900_000_000, 0).unwrap();
        let row = TimelineRow {
            resource_id: 1,
            occupancy: blazar_core::Occupancy {
                start: t,
                end: t,
                blocked_until: t,
                exclusive: false,
                units: 2,
                vcpus: 1,
                memory_mb: 512,
                disk_gb: 5,
            },
            reservation_id: "r".into(),
            lease_id: "l".into(),
            lease_name: "n".into(),
            project_id: "p1".into(),
            status: blazar_core::LeaseStatus::Active,
            degraded: false,
        };
        let mine = busy_interval(row.clone(), "p1", false);
        assert!(mine.own);
        assert_eq!(mine.holder.map(|h| h.lease_name), Some("n".to_string()));
        let theirs = busy_interval(row.clone(), "p2", false);
        assert!(!theirs.own);
        assert_eq!(theirs.holder, None);
        assert_eq!(
            theirs.holding,
            Holding::Slots {
                units: 2,
                size: Usage {
                    vcpus: 1,
                    memory_mb: 512,
                    disk_gb: 5
                }
            }
        );
        let admin = busy_interval(row, "p2", true);
        assert!(!admin.own);
        assert_eq!(admin.holder.map(|h| h.project_id), Some("p1".to_string()));
    }
}
