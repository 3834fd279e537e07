//! `GET /v1/<resources>/allocations` for every resource at once, read a batch of resources
//! at a time so that the answer can be streamed: the server's memory does not grow with the
//! number of allocations, however many clients read the list together.

use blazar_core::PHYSICAL_HOST;
use blazar_core::lease::When;
use blazar_db::{AllocationFilter, AllocationView};

use crate::hosts::{AllocationEntry, allocation_entries};
use crate::inventory::KindSpec;
use crate::{Identity, Service, ServiceError, ServiceResult};

/// Resources read per batch of an allocation list at most: 10,000 hosts are ten queries.
/// Denser allocations make batches smaller (`Settings::list_batch_allocations`), so this
/// only bounds sparse answers, a week's window of a busy year or an idle cloud, whose cost
/// was one read per batch (a week's window of 100,000 allocations took 40 of 250).
pub(crate) const BATCH: usize = 1_000;

/// Resources the first batch takes, before the density is known: at a million allocations
/// 250 hosts held 25,000 (4.5 MB of JSON), and every reader held its first batch rendered
/// while its client caught up. The next batches grow to what the density allows.
pub(crate) const FIRST_BATCH: usize = 25;

/// How many resources the next batch takes, from what the last one held: about `target`
/// allocations, at least one resource, at most `cap`.
pub(crate) fn next_batch_size(
    resources: usize,
    allocations: usize,
    target: usize,
    cap: usize,
) -> usize {
    if allocations == 0 {
        return cap;
    }
    (resources.saturating_mul(target.max(1)) / allocations).clamp(1, cap)
}

/// One batch of an allocation list, holding its permit of the large reads until it is
/// dropped: the caller renders it before dropping it, so that the batches in memory at
/// once, read or being rendered, are bounded however many clients read lists.
pub struct AllocationBatch {
    pub entries: Vec<AllocationEntry>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Allocations a window may hold to be read at once, by time, instead of by resource in
/// batches (`Tx::allocation_views_in_window`), per `Settings::list_batch_allocations`: a
/// week of a busy year at 10,000 hosts (4,000) is one read of a few milliseconds instead of
/// ten of the whole year, and a reader holds at most this many (some 64 bytes each) while
/// its client takes the answer.
const WINDOW_READ_BATCHES: usize = 2;

/// Which allocation list.
#[derive(Debug, Clone, Copy)]
pub enum AllocationKind {
    Hosts,
    Pool(&'static KindSpec),
}

impl AllocationKind {
    fn resource_type(self) -> &'static str {
        match self {
            AllocationKind::Hosts => PHYSICAL_HOST,
            AllocationKind::Pool(spec) => spec.kind,
        }
    }

    fn rule(self) -> String {
        match self {
            AllocationKind::Hosts => "blazar:oshosts:get_allocations".to_string(),
            AllocationKind::Pool(spec) => format!("{}:get_allocations", spec.rules),
        }
    }
}

/// What an allocation list asks for.
#[derive(Debug, Clone, Default)]
pub struct AllocationListRequest {
    pub lease_id: Option<String>,
    pub reservation_id: Option<String>,
    /// Only leases that end after `start` and begin before `end`. With neither, nor a lease
    /// or reservation, only leases that have not ended (Blazar's list).
    pub start: Option<When>,
    pub end: Option<When>,
    /// At most this many resources (all when absent).
    pub limit: Option<usize>,
    /// The API id of the last resource of the previous page.
    pub marker: Option<String>,
}

/// An allocation list being read: the resources of the page, in id order, and the filter
/// their allocations are read with. Each batch is read in a short read transaction of its
/// own, so a slow reader holds no connection and no lock between batches; each batch is
/// consistent, the list as a whole is as of the moments its batches were read.
pub struct AllocationList {
    service: Service,
    resource_type: &'static str,
    /// Internal ids of the page's resources, in order.
    ids: Vec<i64>,
    /// Their API ids, for pool resources; a host's is its id written out. Kept apart so
    /// that a reader of 10,000 hosts holds 80 kB, however many read at once.
    uids: Vec<String>,
    filter: AllocationFilter,
    /// A window's allocations read at once, in resource order, when it holds few
    /// (`WINDOW_READ_BATCHES`): the batches take theirs from here instead of the database.
    window: Option<std::collections::VecDeque<AllocationView>>,
    done: usize,
    /// Resources the next batch takes.
    batch: usize,
    /// The API id to ask for the next page with, when the limit cut the list.
    pub next_marker: Option<String>,
}

impl Service {
    /// A permit of the large reads, for one batch of a streamed list or timeline: held while
    /// the batch is read and, in the batch, until the caller has rendered it (never while the
    /// client takes its time over the answer), so that the batches in memory at once are
    /// bounded however many clients read.
    pub(crate) async fn large_read_permit(
        &self,
    ) -> ServiceResult<tokio::sync::OwnedSemaphorePermit> {
        self.large_reads
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ServiceError::Internal("the server is shutting down".into()))
    }

    /// The rules an allocation read needs, for the edge to check before it reads the query
    /// string: Blazar refuses a caller before it looks at the parameters. `one`: the read of
    /// one resource's allocations (hosts also need `oshosts:get` there, checked first).
    pub fn authorize_allocation_read(
        &self,
        identity: &Identity,
        kind: AllocationKind,
        one: bool,
    ) -> ServiceResult<()> {
        if one && matches!(kind, AllocationKind::Hosts) {
            self.authorize_own("blazar:oshosts:get", identity)?;
        }
        self.authorize_own(&kind.rule(), identity)
    }

    /// Starts reading an allocation list: checks the caller and the request, and takes the
    /// page of resources. Nothing of the allocations is read yet.
    pub async fn allocation_list(
        &self,
        identity: &Identity,
        kind: AllocationKind,
        request: &AllocationListRequest,
    ) -> ServiceResult<AllocationList> {
        self.authorize_own(&kind.rule(), identity)?;
        if request.limit == Some(0) {
            return Err(ServiceError::BadRequest(
                "Malformed parameter limit: must be a positive integer".into(),
            ));
        }
        let filter = self.allocation_filter(request)?;
        let resource_type = kind.resource_type();
        let (mut ids, mut uids): (Vec<i64>, Vec<String>) = in_tx!(self, read, |tx| {
            Ok(match kind {
                AllocationKind::Hosts => {
                    let inventory = self.host_cache.inventory(tx).await?;
                    let mut ids: Vec<i64> = inventory.hosts.iter().map(|h| h.id).collect();
                    ids.sort_unstable();
                    (ids, Vec::new())
                }
                AllocationKind::Pool(_) => {
                    let mut pool: Vec<(i64, String)> = tx
                        .list_resources(resource_type)
                        .await?
                        .into_iter()
                        .map(|r| (r.id, r.resource.uid))
                        .collect();
                    pool.sort_unstable_by_key(|(id, _)| *id);
                    pool.into_iter().unzip()
                }
            })
        })?;
        let api_id = |at: usize, ids: &[i64], uids: &[String]| match uids.get(at) {
            Some(uid) => uid.clone(),
            None => ids[at].to_string(),
        };
        if let Some(marker) = &request.marker {
            let Some(at) = (0..ids.len()).find(|at| api_id(*at, &ids, &uids) == *marker) else {
                return Err(ServiceError::BadRequest(format!(
                    "Marker {marker} not found"
                )));
            };
            ids.drain(..=at);
            uids.drain(..(at + 1).min(uids.len()));
        }
        let next_marker = match request.limit {
            Some(limit) if ids.len() > limit => {
                ids.truncate(limit);
                uids.truncate(limit);
                Some(api_id(limit - 1, &ids, &uids))
            }
            _ => None,
        };
        let window = if ids.is_empty() {
            None
        } else {
            let at_most = self
                .settings
                .list_batch_allocations
                .saturating_mul(WINDOW_READ_BATCHES);
            let _permit = self.large_read_permit().await?;
            in_tx!(self, read, |tx| {
                Ok(tx
                    .allocation_views_in_window(resource_type, &filter, at_most)
                    .await?)
            })?
            .map(std::collections::VecDeque::from)
        };
        Ok(AllocationList {
            service: self.clone(),
            resource_type,
            ids,
            uids,
            filter,
            window,
            done: 0,
            batch: FIRST_BATCH,
            next_marker,
        })
    }
}

impl Service {
    /// What an allocation list, or one resource's allocation, reads under `request`'s
    /// filters: with a window (`start`, `end`), the leases that end after its start and
    /// begin before its end, each with the resources it held at some time in the window
    /// (`AllocationFilter::starts_before`); without one, nor a lease or reservation, only
    /// leases that have not ended (Blazar's list).
    pub(crate) fn allocation_filter(
        &self,
        request: &AllocationListRequest,
    ) -> ServiceResult<AllocationFilter> {
        let now = self.now();
        let start = request.start.map(|w| w.resolve(now));
        let end = request.end.map(|w| w.resolve(now));
        if let (Some(start), Some(end)) = (start, end)
            && end <= start
        {
            return Err(ServiceError::BadRequest(format!(
                "end ({}) must be later than start ({})",
                end.format("%Y-%m-%d %H:%M"),
                start.format("%Y-%m-%d %H:%M")
            )));
        }
        let windowed = start.is_some() || end.is_some();
        let unfiltered = request.lease_id.is_none() && request.reservation_id.is_none();
        Ok(AllocationFilter {
            resources: None,
            lease_id: request.lease_id.clone(),
            reservation_id: request.reservation_id.clone(),
            ends_after: if windowed {
                start
            } else {
                unfiltered.then_some(now)
            },
            starts_before: end,
        })
    }
}

impl AllocationList {
    /// The entries of the next batch of resources, in order; `None` once all are read.
    pub async fn next_batch(&mut self) -> ServiceResult<Option<AllocationBatch>> {
        let Some(rest) = self.ids.get(self.done..) else {
            return Ok(None);
        };
        let batch = &rest[..rest.len().min(self.batch)];
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
            return Ok(None);
        };
        let filter = AllocationFilter {
            resources: Some((*first, *last)),
            ..self.filter.clone()
        };
        let service = &self.service;
        let permit = service.large_read_permit().await?;
        let views = match self.window.as_mut() {
            // Those of the batch's resources; any before them belong to resources the page
            // left out (a marker's), and are dropped with the batch's.
            Some(window) => {
                let held = window.partition_point(|v| v.resource_id <= *last);
                window.drain(..held).collect()
            }
            None => in_tx!(service, read, |tx| {
                Ok(tx
                    .allocation_views_where(self.resource_type, &filter)
                    .await?)
            })?,
        };
        let (resources, held) = (batch.len(), views.len());
        let uids = self.uids.get(self.done..).unwrap_or_default();
        let entries = allocation_entries(
            batch.iter().enumerate().map(|(at, id)| {
                let uid = uids.get(at).cloned().unwrap_or_else(|| id.to_string());
                (*id, uid)
            }),
            views,
        );
        self.done += resources;
        self.batch = next_batch_size(
            resources,
            held,
            service.settings.list_batch_allocations,
            BATCH,
        );
        Ok(Some(AllocationBatch {
            entries,
            _permit: permit,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_shrink_with_dense_allocations_and_grow_back() {
        // Ten allocations a host: the target's worth of hosts, capped.
        assert_eq!(next_batch_size(250, 2_500, 2_500, BATCH), 250);
        assert_eq!(next_batch_size(250, 25_000, 2_500, BATCH), 25);
        assert_eq!(next_batch_size(25, 250, 2_500, BATCH), 250);
        // A week's window of a busy year, under one allocation a host: the cap.
        assert_eq!(next_batch_size(1_000, 400, 2_500, BATCH), BATCH);
        // Empty hosts: as many as a batch takes; one crowded host: that host alone.
        assert_eq!(next_batch_size(10, 0, 2_500, BATCH), BATCH);
        assert_eq!(next_batch_size(1, 1_000_000, 2_500, BATCH), 1);
        assert_eq!(next_batch_size(3, 10, 0, BATCH), 1);
        // A larger cap lets sparse batches grow to it.
        assert_eq!(next_batch_size(250, 250, 2_500, 1_000), 1_000);
    }
}
