//! Choosing resources for a reservation spec and writing its allocations: the dispatch over
//! the spec's type, the availability probe every type of whole resources shares, the host
//! inventory cache, and `physical:host` itself. Instance slots are in `instance.rs`, pools of
//! floating IPs, network segments and devices in `pool.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use blazar_core::ReservationSpec;
use blazar_core::host::HostRecord;
use blazar_core::reservation::{HostSpec, Query};
use blazar_core::{PHYSICAL_HOST, PropertyQuery, TimeWindow, engine};
use blazar_db::{AllocationUsage, Backend, NewAllocation, Tx};
use chrono::{DateTime, Utc};

use crate::refusal::ReservationRef;
use crate::{Availability, Reason, ServiceError, ServiceResult};

/// What an allocation is for.
#[derive(Debug, Clone)]
pub struct AllocationRequest<'a> {
    pub lease_id: &'a str,
    pub reservation_id: &'a str,
    /// How messages name the reservation: its 1-based position in a create, its id in an
    /// update (as the refusal's reasons do).
    pub named: ReservationRef,
    pub window: TimeWindow,
    pub blocked_until: DateTime<Utc>,
    /// Resources the reservation holds already; kept when possible.
    pub keep: &'a [i64],
    /// Whether a refusal may say why (counts, which address is taken) or must be Blazar's
    /// bare message: the `blazar:leases:explain_refusal` rule, and never when a non-admin's
    /// query names a private property.
    pub explain: bool,
}

impl AllocationRequest<'_> {
    /// The reason a shortfall of this request gives: with `counts` (matching, free) when
    /// the caller may be told them. The lease fills in what was requested.
    pub(crate) fn reason(&self, resource_type: &str, counts: Option<(usize, usize)>) -> Reason {
        let availability = counts.map(|(matching, free)| Availability {
            matching: i64::try_from(matching).unwrap_or(i64::MAX),
            free: i64::try_from(free).unwrap_or(i64::MAX),
            window: self.window,
            next_offer: None,
        });
        Reason::shortfall(self.named.clone(), resource_type, availability)
    }

    /// The refusal of a shortfall of `resource_type`: Blazar's `bare` message, unless the
    /// caller may be told the (matching, free) `counts`; then `explained`'s, which names
    /// them and the window (given as `from .. to ..`).
    pub(crate) fn shortfall(
        &self,
        resource_type: &str,
        bare: &str,
        counts: (usize, usize),
        explained: impl FnOnce(String) -> String,
    ) -> ServiceError {
        if !self.explain {
            return ServiceError::shortfall(
                resource_type,
                bare,
                vec![self.reason(resource_type, None)],
            );
        }
        let window = format!(
            "from {} to {}",
            self.window.start().format("%Y-%m-%d %H:%M"),
            self.window.end().format("%Y-%m-%d %H:%M"),
        );
        ServiceError::shortfall(
            resource_type,
            explained(window),
            vec![self.reason(resource_type, Some(counts))],
        )
    }

    /// What the allocations of `ids` (hosts, for instance slots) use within this request's
    /// window and cleaning margin.
    pub(crate) async fn usage_among(
        &self,
        tx: &mut Tx,
        kind: &str,
        ids: &[i64],
    ) -> ServiceResult<Vec<AllocationUsage>> {
        Ok(tx
            .usage_among(kind, ids, self.window.start(), self.blocked_until, None)
            .await?)
    }
}

/// What an allocation granted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// The resources allocated (host ids for instance slots).
    pub resources: Vec<i64>,
    /// Units granted: hosts, devices, addresses, segments, or instance slots.
    pub units: i64,
}

/// How many candidates one query checks for availability.
const PROBE_BATCH: usize = 128;

/// Picks between `min` and `max` free resources of `kind` among `matching` (those in `keep`
/// first), checking availability batch by batch in preference order and stopping as soon as
/// `max` are free: on a large inventory most candidates are never looked at.
///
/// Every resource picked is claimed for this transaction first (see [`Tx::try_claim_resources`]):
/// on PostgreSQL, concurrent writers choosing among the same candidates skip each other's
/// claims and go on to the next free ones (at a random place of the rest once a batch fell
/// short after passing over others' claims), and wait only for the ones they keep. With too
/// few free otherwise, they take free ones another writer claimed, leaving any conflict
/// to the exclusion constraint, unless they hold nothing yet: then they wait for the first
/// such claim and probe it again. A claimed resource is probed again, since its allocation
/// may have been committed between the probe and the claim.
pub(crate) async fn pick_free(
    tx: &mut Tx,
    kind: &str,
    matching: &[i64],
    keep: &[i64],
    request: &AllocationRequest<'_>,
    min: usize,
    max: usize,
) -> ServiceResult<Result<Vec<i64>, engine::Shortfall>> {
    let mut order: Vec<i64> = Vec::with_capacity(matching.len());
    // How many of `order`'s first candidates are ones to keep.
    let mut kept = 0;
    if keep.is_empty() {
        order.extend_from_slice(matching);
    } else {
        let matching_set: HashSet<i64> = matching.iter().copied().collect();
        // Once each: a pool's required resources are kept as well as held, and a candidate
        // twice in the order would be claimed and counted twice.
        let mut kept_set = HashSet::new();
        order.extend(
            keep.iter()
                .copied()
                .filter(|id| matching_set.contains(id) && kept_set.insert(*id)),
        );
        kept = order.len();
        order.extend(matching.iter().copied().filter(|id| !kept_set.contains(id)));
    }
    let concurrent = tx.backend() == Backend::Postgres;
    if concurrent {
        // What this request keeps is claimed first, waiting, in id order, before it holds
        // any other claim: a writer that waited for a resource to keep while holding
        // candidates it had claimed on the way could close a circle with another writer
        // doing the same (each holding what the other keeps), which PostgreSQL breaks only
        // after `deadlock_timeout`, a second per round (seen as lease updates of several
        // seconds under 8 to 64 concurrent clients). Claims are re-entrant, so claiming
        // them again below succeeds at once.
        tx.claim_resources(kind, &order[..kept]).await?;
    }
    let (start, until) = (request.window.start(), request.blocked_until);
    let mut busy = HashSet::new();
    let mut contended: Vec<i64> = Vec::new();
    let mut probed = 0;
    let mut free = 0;
    // A first batch sized to the request (most candidates are free at most times), then
    // twice as large each time too few turn out free: where whole groups of candidates are
    // busy together (a rack leased at once), a fixed large batch would probe far more than
    // the few the request still needs.
    let mut batch_size = (4 * max + 8).min(PROBE_BATCH);
    while probed < order.len() && free < max {
        let end = (probed + batch_size).min(order.len());
        let batch = &order[probed..end];
        let taken = tx.busy_among(kind, batch, start, until).await?;
        busy.extend(taken.iter().copied());
        let mut unclaimed: Vec<i64> = batch
            .iter()
            .copied()
            .filter(|id| !taken.contains(id))
            .collect();
        // Claimed as many as are still wanted, walking past others' claims in one
        // statement: what this request will not use stays free for the others. A claimed
        // resource is probed again, since its allocation may have been committed between
        // the probe and the claim; only then is the walk taken up again (rarely).
        let mut considered = 0;
        let mut passed_over = false;
        while free < max && considered < unclaimed.len() {
            let (claimed, others) = tx
                .try_claim_resources(kind, &unclaimed[considered..], max - free)
                .await?;
            considered += claimed.len() + others.len();
            passed_over |= !others.is_empty();
            busy.extend(others.iter().copied());
            contended.extend(others);
            let late = if concurrent {
                tx.busy_among(kind, &claimed, start, until).await?
            } else {
                HashSet::new()
            };
            free += claimed.iter().filter(|id| !late.contains(id)).count();
            busy.extend(late);
        }
        // Free candidates of the batch left unclaimed are not offered to `pick`: the probe
        // ends at the last one considered.
        unclaimed.truncate(considered);
        probed = match unclaimed.last() {
            Some(last) if free >= max => batch
                .iter()
                .position(|id| id == last)
                .map_or(end, |i| probed + i + 1),
            _ => end,
        };
        batch_size = (2 * batch_size).min(PROBE_BATCH);
        if concurrent && passed_over && free < max && probed >= kept && probed < order.len() {
            // Other writers hold the first candidates: every writer walks the same
            // preference order, and a claim is on the resource whatever the window, so
            // concurrent writers of disjoint windows all meet at its head. Walking past
            // them costs a probe of every claimed resource (64 writers of a few hosts each
            // keep hundreds claimed there). Instead the walk goes on at a random place of
            // the rest, where few are claimed, and wraps around to what it jumped over, so
            // every candidate can still be reached. Without contention the order is kept,
            // so an offer made at a quiet moment is what a create then gets.
            let rest = &mut order[probed..];
            let turn = getrandom::u64().map_or(0, |r| r % rest.len() as u64);
            rest.rotate_left(usize::try_from(turn).unwrap_or(0));
            batch_size = (4 * (max - free) + 8).min(PROBE_BATCH);
        }
    }
    // Too few free without resources another writer has claimed: as many of those as are
    // still missing are used all the same, in the order walked. A claim says nothing of
    // the claimer's window, and most of the time it wants another one, so waiting for it
    // would queue writers of disjoint windows behind each other; worse, each waits while
    // holding its own claims, taken out of id order, and such waits close circles that
    // PostgreSQL breaks only after `deadlock_timeout` (hundreds a minute, a second each,
    // with 64 writers wanting some of 50 hosts). The exclusion constraint decides instead:
    // an insert waits only for a transaction holding an overlapping allocation of the same
    // resource, and loses to it with a retry (`grant_whole` inserts in id order, so two
    // such waits do not close a circle either).
    //
    // Except when this transaction holds nothing yet (no claim, no lock, no allocation, no
    // lease): nobody can be waiting for it, so waiting for one claim it lacks closes no
    // circle. Only one: holding that claim, it would close circles waiting for a second.
    // That is the case of many writers racing for the same few resources, where letting
    // them all insert lets the database's exclusion checks wait for each other: two
    // inserters of one resource may each find the other's uncommitted row and wait for it,
    // a circle PostgreSQL breaks only after `deadlock_timeout`, and under dozens of such
    // writers the broken transactions run again into new circles (a 64-client race for one
    // host lasted minutes and granted it to nobody). Waiting instead, each gets the claim
    // once its holder has ended, probes again and finds the resource taken (or free, if the
    // holder gave up), one at a time. Any others still missing are taken as above.
    let missing = min.saturating_sub(free);
    if concurrent && missing > 0 && !contended.is_empty() && !tx.holds_resource_locks() {
        let waited = contended.remove(0);
        tx.claim_resources(kind, &[waited]).await?;
        let late = tx.busy_among(kind, &[waited], start, until).await?;
        if !late.contains(&waited) {
            busy.remove(&waited);
            free += 1;
        }
    }
    let missing = min.saturating_sub(free);
    for id in contended.iter().take(missing) {
        busy.remove(id);
    }
    // Candidates not probed are never reached by `pick`: it stops at `max` free ones.
    Ok(
        engine::pick(&order[..probed], &busy, keep, min, max).map_err(|s| engine::Shortfall {
            matching: matching.len(),
            ..s
        }),
    )
}

/// Allocates up to `missing` whole resources of `kind` among `matching`, for healing.
pub(crate) async fn refill_whole(
    tx: &mut Tx,
    kind: &str,
    matching: &[i64],
    request: &AllocationRequest<'_>,
    missing: i64,
) -> ServiceResult<i64> {
    let wanted = usize::try_from(missing).unwrap_or(0);
    let free: Vec<i64> = pick_free(tx, kind, matching, &[], request, 0, wanted)
        .await?
        .unwrap_or_default();
    let take = wanted.min(free.len());
    let grant = grant_whole(tx, kind, request, free[..take].to_vec()).await?;
    Ok(grant.units)
}

/// Writes exclusive allocations of the chosen resources, after share-locking them: a resource
/// deleted or put out of service by a concurrent transaction since the inventory was read
/// sends the whole transaction round again with a fresh view.
pub(crate) async fn grant_whole(
    tx: &mut Tx,
    kind: &str,
    request: &AllocationRequest<'_>,
    chosen: Vec<i64>,
) -> ServiceResult<Grant> {
    let still_there = lock_reservable(tx, kind, &chosen).await?;
    if still_there.len() != chosen.len() {
        return Err(ServiceError::Retry(format!(
            "a chosen {kind} resource changed concurrently"
        )));
    }
    // In id order: two writers inserting into the same resources wait for each other (the
    // exclusion constraint) in one order, never in a circle.
    let mut ordered = chosen.clone();
    ordered.sort_unstable();
    let rows: Vec<NewAllocation> = ordered
        .iter()
        .map(|id| whole_allocation(request, kind, *id))
        .collect();
    tx.insert_allocations(&rows).await?;
    Ok(Grant {
        units: chosen.len() as i64,
        resources: chosen,
    })
}

pub(crate) fn whole_allocation(
    request: &AllocationRequest<'_>,
    kind: &str,
    id: i64,
) -> NewAllocation {
    NewAllocation::whole(
        request.reservation_id,
        request.lease_id,
        kind,
        id,
        (
            request.window.start(),
            request.window.end(),
            request.blocked_until,
        ),
    )
}

/// Share-locks the chosen resources of a kind; returns those still present and reservable.
/// Once they are locked nobody can change them before this transaction ends; a change
/// committed while it chose them (a lower capacity, a property its filter read) sends the
/// transaction round again to choose from what is there now.
pub(crate) async fn lock_reservable(
    tx: &mut Tx,
    kind: &str,
    ids: &[i64],
) -> ServiceResult<Vec<i64>> {
    let locked = if kind == PHYSICAL_HOST {
        if tx.backend() == Backend::Sqlite && tx.is_writer() {
            // Host candidates come from the inventory version read in this transaction, and
            // a SQLite writer holds the database's only write lock from its first statement:
            // no host can have changed since.
            return Ok(ids.to_vec());
        }
        tx.lock_reservable_hosts(ids).await?
    } else {
        tx.lock_reservable_resources(ids).await?
    };
    if !tx.inventory_unchanged(kind).await? {
        return Err(ServiceError::Retry(format!(
            "the {kind} inventory changed while resources were chosen from it"
        )));
    }
    Ok(locked)
}

/// The host inventory as of one inventory version, with an index by id and each host's own
/// allocation ratios read once: an instance search weighs every matching host, and reading
/// the ratios from the capabilities each time was most of its CPU at 10,000 hosts.
pub struct Inventory {
    pub hosts: Vec<HostRecord>,
    index: HashMap<i64, usize>,
    ratios: Vec<crate::instance::HostRatios>,
}

impl Inventory {
    pub fn new(hosts: Vec<HostRecord>) -> Inventory {
        let index = hosts.iter().enumerate().map(|(i, h)| (h.id, i)).collect();
        let ratios = hosts.iter().map(crate::instance::HostRatios::of).collect();
        Inventory {
            hosts,
            index,
            ratios,
        }
    }

    pub fn get(&self, id: i64) -> Option<&HostRecord> {
        self.index.get(&id).map(|i| &self.hosts[*i])
    }

    /// The hosts `ids` (ascending, as filters answer them) with their capacity for instances
    /// (totals times ratios, their own where they set them, else `defaults`). The hosts are
    /// in id order too, so one walk over both finds them: no lookup per host.
    pub fn with_capacity<'a>(
        &'a self,
        ids: &'a [i64],
        defaults: crate::instance::Ratios,
    ) -> impl Iterator<Item = (&'a HostRecord, blazar_core::engine::Usage)> + 'a {
        let sorted = ids.is_sorted() && self.hosts.is_sorted_by_key(|h| h.id);
        let mut next = 0;
        ids.iter().filter_map(move |&id| {
            let i = if sorted {
                // Hosts before `id` are not asked for (most often `id` is the next one);
                // an id no host has is skipped.
                if self.hosts.get(next).is_some_and(|h| h.id != id) {
                    next += self.hosts[next..].partition_point(|h| h.id < id);
                }
                let found = self.hosts.get(next).filter(|h| h.id == id).map(|_| next);
                if found.is_some() {
                    next += 1;
                }
                found?
            } else {
                *self.index.get(&id)?
            };
            let host = &self.hosts[i];
            Some((host, self.ratios[i].capacity(host, defaults)))
        })
    }

    /// The hosts `ids` (as `with_capacity` takes them) that could hold one `slot`-sized
    /// instance when empty, with their capacity.
    pub fn fitting<'a>(
        &'a self,
        ids: &'a [i64],
        defaults: crate::instance::Ratios,
        slot: blazar_core::engine::Usage,
    ) -> impl Iterator<Item = (&'a HostRecord, blazar_core::engine::Usage)> + 'a {
        let empty = blazar_core::engine::Usage::default();
        self.with_capacity(ids, defaults)
            .filter(move |(_, cap)| blazar_core::engine::free_slots(*cap, empty, slot) > 0)
    }
}

/// An inventory copy with the remembered matches of one filter, if any.
type Cached = (Arc<Inventory>, Option<Arc<Vec<i64>>>);

/// The hosts of one filter that could hold one instance of a size when empty, with their
/// capacity for instances, in id order (`HostCache::fitting`).
pub type Fitting = Arc<Vec<(i64, blazar_core::engine::Usage)>>;

struct Snapshot {
    version: i64,
    inventory: Arc<Inventory>,
    /// Matching host ids per query text: most requests repeat a few filters.
    matches: Remembered<i64>,
    /// Fitting hosts per query text, instance size and default ratios: an instance search
    /// weighs every matching host, and most requests repeat a few sizes.
    fits: Remembered<(i64, blazar_core::engine::Usage)>,
}

/// Most memory the remembered filters may take per inventory version. Bounded by bytes, not
/// entries: keys are request text, and a count bound let large distinct queries (each
/// refused, nothing stored) grow the server by a gigabyte.
pub(crate) const MAX_CACHED_FILTER_BYTES: usize = 16 * 1024 * 1024;

/// Most memory the remembered fitting hosts may take per inventory version (a list is 32
/// bytes per host: 25 sizes of filters matching 10,000 hosts).
const MAX_CACHED_FIT_BYTES: usize = 8 * 1024 * 1024;

/// Lists remembered by text key within a byte budget.
struct Remembered<V> {
    lists: HashMap<String, Arc<Vec<V>>>,
    /// What `lists` holds, in bytes (see `weight`).
    bytes: usize,
    budget: usize,
}

impl<V> Remembered<V> {
    fn new(budget: usize) -> Remembered<V> {
        Remembered {
            lists: HashMap::new(),
            bytes: 0,
            budget,
        }
    }

    /// The memory one remembered list takes: its key, its items, and the map's overhead.
    fn weight(key: &str, list: &[V]) -> usize {
        key.len() + std::mem::size_of_val(list) + 64
    }

    fn get(&self, key: &str) -> Option<Arc<Vec<V>>> {
        self.lists.get(key).cloned()
    }

    /// Remembers a list within the byte budget. When it would overflow, the remembered
    /// lists are dropped at once (cheap, and the common ones come back first).
    fn remember(&mut self, key: &str, list: &Arc<Vec<V>>) {
        let weight = Self::weight(key, list);
        if weight > self.budget / 4 {
            return;
        }
        if self.bytes + weight > self.budget {
            self.lists.clear();
            self.bytes = 0;
        }
        if let Some(old) = self.lists.insert(key.to_string(), list.clone()) {
            self.bytes -= Self::weight(key, &old);
        }
        self.bytes += weight;
    }
}

impl Snapshot {
    fn new(version: i64, inventory: Arc<Inventory>) -> Snapshot {
        Snapshot {
            version,
            inventory,
            matches: Remembered::new(MAX_CACHED_FILTER_BYTES),
            fits: Remembered::new(MAX_CACHED_FIT_BYTES),
        }
    }
}

/// The host inventory kept in memory between requests. Every change to hosts moves a version
/// counter in the database (in the changing transaction); a request reads the counter in its
/// own transaction and reloads when it moved, so a copy is never used once stale, whichever
/// process changed the hosts. This turns the per-request cost of candidate search from
/// "read every host and capability" into one indexed read.
#[derive(Default)]
pub struct HostCache {
    state: std::sync::Mutex<Option<Snapshot>>,
    /// Held while the inventory is read from the database: requests that find the copy
    /// stale at once wait for one reload instead of each reading every host (sixteen
    /// lists of 10,000 hosts arriving at a cold server took it from 18 to 260 MB).
    loading: tokio::sync::Mutex<()>,
    /// How many times the inventory was read from the database.
    loads: std::sync::atomic::AtomicU64,
}

impl HostCache {
    /// The hosts matching `queries` (keyed by `key`, the query texts), and the inventory.
    pub async fn matching(
        &self,
        tx: &mut Tx,
        queries: &[(&str, &Query)],
        key: &str,
    ) -> ServiceResult<(Arc<Inventory>, Arc<Vec<i64>>)> {
        let (version, inventory, cached) = self.snapshot(tx, Some(key)).await?;
        if let Some(matching) = cached {
            return Ok((inventory, matching));
        }
        let matching = match matching_hosts(&inventory.hosts, queries) {
            Ok(mut matching) => {
                // What is remembered is weighed by its length.
                matching.shrink_to_fit();
                Arc::new(matching)
            }
            Err(unknown) => return Err(unknown.into_error(tx, PHYSICAL_HOST).await),
        };
        if let Some(snapshot) = self.lock().as_mut().filter(|s| s.version == version) {
            snapshot.matches.remember(key, &matching);
        }
        Ok((inventory, matching))
    }

    /// The hosts matching `queries` (keyed by `key`) that could hold one `slot`-sized
    /// instance when empty, with their capacity (totals times ratios, `defaults` where a
    /// host sets none), in id order. Remembered per inventory version, so that a search
    /// costs the hosts it probes rather than every matching host.
    pub async fn fitting(
        &self,
        tx: &mut Tx,
        queries: &[(&str, &Query)],
        key: &str,
        slot: blazar_core::engine::Usage,
        defaults: crate::instance::Ratios,
    ) -> ServiceResult<Fitting> {
        let (inventory, matching) = self.matching(tx, queries, key).await?;
        let fit_key = format!(
            "{}/{}/{}/{}/{}/{} {key}",
            slot.vcpus,
            slot.memory_mb,
            slot.disk_gb,
            defaults.cpu.to_bits(),
            defaults.ram.to_bits(),
            defaults.disk.to_bits()
        );
        // The copy `matching` answered from, if it is still the one kept.
        let same = |s: &&mut Snapshot| Arc::ptr_eq(&s.inventory, &inventory);
        if let Some(found) = self
            .lock()
            .as_mut()
            .filter(same)
            .and_then(|s| s.fits.get(&fit_key))
        {
            return Ok(found);
        }
        let mut fits: Vec<_> = inventory
            .fitting(&matching, defaults, slot)
            .map(|(host, cap)| (host.id, cap))
            .collect();
        // What is remembered is weighed by its length.
        fits.shrink_to_fit();
        let fits: Fitting = Arc::new(fits);
        if let Some(snapshot) = self.lock().as_mut().filter(same) {
            snapshot.fits.remember(&fit_key, &fits);
        }
        Ok(fits)
    }

    /// The current inventory.
    pub async fn inventory(&self, tx: &mut Tx) -> ServiceResult<Arc<Inventory>> {
        Ok(self.snapshot(tx, None).await?.1)
    }

    /// The inventory of the database's current version (reloaded if the copy is stale), and
    /// the cached matches of `key` if any.
    async fn snapshot(
        &self,
        tx: &mut Tx,
        key: Option<&str>,
    ) -> ServiceResult<(i64, Arc<Inventory>, Option<Arc<Vec<i64>>>)> {
        let version = tx.inventory_version(PHYSICAL_HOST).await?;
        if let Some((inventory, matching)) = self.cached(version, key) {
            return Ok((version, inventory, matching));
        }
        // A transaction that changed the hosts sees what may never commit: it reads its own
        // copy and keeps it to itself.
        let shared = !tx.changed_inventory(PHYSICAL_HOST);
        let _loading = if shared {
            let loading = self.loading.lock().await;
            // Whoever held it may have loaded this very version.
            if let Some((inventory, matching)) = self.cached(version, key) {
                return Ok((version, inventory, matching));
            }
            Some(loading)
        } else {
            None
        };
        let hosts = tx.list_hosts().await?;
        self.loads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let inventory = Arc::new(Inventory::new(hosts));
        if shared {
            *self.lock() = Some(Snapshot::new(version, inventory.clone()));
        }
        Ok((version, inventory, None))
    }

    /// How many times the inventory was read from the database.
    #[cfg(test)]
    fn loads(&self) -> u64 {
        self.loads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The copy of `version`, if it is the one kept, with the cached matches of `key`.
    fn cached(&self, version: i64, key: Option<&str>) -> Option<Cached> {
        self.lock()
            .as_ref()
            .filter(|s| s.version == version)
            .map(|s| (s.inventory.clone(), key.and_then(|k| s.matches.get(k))))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Snapshot>> {
        // A panic while holding the lock cannot leave the snapshot half-written (it is
        // replaced whole), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Blazar's refusal when hosts (or instance slots) are short, without the reasons.
pub(crate) const NOT_ENOUGH_HOSTS: &str = "Not enough hosts available";

/// A query on a property no resource of the kind has (Blazar answers those with a 500).
#[derive(Debug)]
pub(crate) struct UnknownProperty {
    field: String,
    key: String,
    noun: &'static str,
    /// Every capability name the resources have, private ones included.
    known: Vec<String>,
}

/// Most capability names an unknown-property refusal lists.
const MAX_NAMES_SHOWN: usize = 50;

impl UnknownProperty {
    /// The 400 a caller sees. Private property names are never listed (the caller may not be
    /// allowed to know them; admins list them with the properties API).
    pub(crate) async fn into_error(self, tx: &mut Tx, resource_type: &str) -> ServiceError {
        let private = match tx.private_property_names(resource_type).await {
            Ok(names) => names,
            Err(e) => return e.into(),
        };
        let shown: Vec<&str> = self
            .known
            .iter()
            .map(String::as_str)
            .filter(|k| !private.contains(*k))
            .collect();
        // A few dozen names say what was meant; a site's thousands would make the answer
        // hundreds of kilobytes.
        let known = match shown.len() {
            0 => format!("no {} has public extra capabilities", self.noun),
            n if n <= MAX_NAMES_SHOWN => format!("known extra capabilities: {}", shown.join(", ")),
            n => format!(
                "known extra capabilities: {} and {} more",
                shown[..MAX_NAMES_SHOWN].join(", "),
                n - MAX_NAMES_SHOWN
            ),
        };
        ServiceError::BadRequest(format!(
            "Unknown property ${} in {}: no {} has it ({known})",
            self.key, self.field, self.noun
        ))
    }
}

/// Finds a query key that names no column and no capability of any resource.
/// `is_column` tells the fixed fields every resource of the kind has.
pub(crate) fn check_known_properties<'a>(
    field: &str,
    query: &PropertyQuery,
    is_column: impl Fn(&str) -> bool,
    capabilities: impl Iterator<Item = &'a BTreeMap<String, String>> + Clone,
    noun: &'static str,
) -> Result<(), UnknownProperty> {
    for key in query.keys() {
        if is_column(key) || capabilities.clone().any(|c| c.contains_key(key)) {
            continue;
        }
        let mut known: Vec<String> = capabilities
            .clone()
            .flat_map(|c| c.keys().cloned())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        known.sort_unstable();
        return Err(UnknownProperty {
            field: field.to_string(),
            key: key.to_string(),
            noun,
            known,
        });
    }
    Ok(())
}

/// The cache key of a reservation's filters: its query texts.
pub(crate) fn filter_key(queries: &[(&str, &Query)]) -> String {
    let texts: Vec<&str> = queries.iter().map(|(_, q)| q.text()).collect();
    texts.join("\u{1}")
}

/// Hosts that are reservable and match every property query, in id order.
pub(crate) fn matching_hosts(
    hosts: &[HostRecord],
    queries: &[(&str, &Query)],
) -> Result<Vec<i64>, UnknownProperty> {
    for (field, query) in queries {
        if let Some(q) = query.parsed() {
            check_known_properties(
                field,
                q,
                HostRecord::is_column,
                hosts.iter().map(|h| &h.capabilities),
                "host",
            )?;
        }
    }
    Ok(hosts
        .iter()
        .filter(|h| h.reservable)
        .filter(|h| {
            let lookup = |k: &str| h.property(k);
            queries
                .iter()
                .all(|(_, q)| q.parsed().is_none_or(|q| q.matches(&lookup)))
        })
        .map(|h| h.id)
        .collect())
}

/// The hosts a host reservation may take. No lock is needed: [`pick_free`] claims what it
/// picks, and the database's exclusion constraint refuses any overlap left.
async fn host_candidates(
    tx: &mut Tx,
    cache: &HostCache,
    spec: &HostSpec,
) -> ServiceResult<Arc<Vec<i64>>> {
    let queries = [
        ("hypervisor_properties", &spec.hypervisor_properties),
        ("resource_properties", &spec.resource_properties),
    ];
    let (_, matching) = cache.matching(tx, &queries, &filter_key(&queries)).await?;
    Ok(matching)
}

/// `physical:host`: between `min` and `max` whole hosts matching both queries.
pub(crate) async fn allocate_hosts(
    tx: &mut Tx,
    cache: &HostCache,
    spec: &HostSpec,
    request: &AllocationRequest<'_>,
) -> ServiceResult<Grant> {
    let matching = host_candidates(tx, cache, spec).await?;
    let chosen = pick_free(
        tx,
        PHYSICAL_HOST,
        &matching,
        request.keep,
        request,
        count(spec.min),
        count(spec.max),
    )
    .await?
    .map_err(|s| {
        request.shortfall(
            PHYSICAL_HOST,
            NOT_ENOUGH_HOSTS,
            (s.matching, s.free),
            |window| {
                format!(
                    "Not enough hosts available for reservation {} (physical:host, min {}): {} \
                     host(s) match the filters and are reservable, {} of them free {window}",
                    request.named, s.min, s.matching, s.free,
                )
            },
        )
    })?;
    grant_whole(tx, PHYSICAL_HOST, request, chosen).await
}

/// Healing of a host reservation: up to `missing` more matching hosts.
pub(crate) async fn refill_hosts(
    tx: &mut Tx,
    cache: &HostCache,
    spec: &HostSpec,
    request: &AllocationRequest<'_>,
    missing: i64,
) -> ServiceResult<i64> {
    let matching = host_candidates(tx, cache, spec).await?;
    refill_whole(tx, PHYSICAL_HOST, &matching, request, missing).await
}

/// A validated count as a length.
pub(crate) fn count(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl crate::Service {
    /// Chooses resources for `spec` over the request's window and writes the allocations,
    /// in the caller's transaction.
    pub(crate) async fn allocate(
        &self,
        tx: &mut Tx,
        spec: &ReservationSpec,
        request: &AllocationRequest<'_>,
    ) -> ServiceResult<Grant> {
        match spec {
            ReservationSpec::Host(host) => {
                allocate_hosts(tx, &self.host_cache, host, request).await
            }
            ReservationSpec::Instance(_) | ReservationSpec::FlavorInstance(_) => {
                let shape = crate::instance::Shape::of(spec, &self.trait_hosts)?;
                crate::instance::allocate_shape(
                    tx,
                    &shape,
                    request,
                    self.settings.ratios,
                    &self.host_cache,
                    spec.resource_type(),
                )
                .await
            }
            ReservationSpec::FloatingIp(_)
            | ReservationSpec::Network(_)
            | ReservationSpec::Device(_) => crate::pool::allocate(tx, spec, request).await,
        }
    }

    /// Allocates up to `missing` more units over the window for a reservation that lost
    /// some (healing), avoiding what it holds. Returns the units added.
    pub(crate) async fn refill(
        &self,
        tx: &mut Tx,
        spec: &ReservationSpec,
        request: &AllocationRequest<'_>,
        missing: i64,
    ) -> ServiceResult<i64> {
        match spec {
            ReservationSpec::Host(host) => {
                refill_hosts(tx, &self.host_cache, host, request, missing).await
            }
            ReservationSpec::Instance(_) | ReservationSpec::FlavorInstance(_) => {
                let shape = crate::instance::Shape::of(spec, &self.trait_hosts)?;
                crate::instance::refill_shape(
                    tx,
                    &shape,
                    request,
                    self.settings.ratios,
                    &self.host_cache,
                    missing,
                )
                .await
            }
            ReservationSpec::FloatingIp(_)
            | ReservationSpec::Network(_)
            | ReservationSpec::Device(_) => crate::pool::refill(tx, spec, request, missing).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_filters_stay_within_their_byte_budget() {
        let mut remembered = Remembered::new(MAX_CACHED_FILTER_BYTES);
        let ids = Arc::new((0..1_000).collect::<Vec<i64>>());
        for i in 0..2_000 {
            // Distinct keys of 64 kB each, the largest query taken.
            let key = format!("{i}{}", "x".repeat(65_530));
            remembered.remember(&key, &ids);
            let held: usize = remembered
                .lists
                .iter()
                .map(|(k, v)| Remembered::weight(k, v))
                .sum();
            assert_eq!(held, remembered.bytes);
            assert!(held <= MAX_CACHED_FILTER_BYTES, "{held} bytes after {i}");
        }
        assert!(!remembered.lists.is_empty());
        // Remembering a key again replaces it without counting it twice.
        let before = remembered.bytes;
        let key = remembered.lists.keys().next().cloned().unwrap();
        remembered.remember(&key, &ids);
        assert_eq!(remembered.bytes, before);
        // A list over a quarter of the budget is not kept at all.
        let mut small = Remembered::new(1_000);
        small.remember("k", &ids);
        assert!(small.get("k").is_none());
        assert_eq!(small.bytes, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn requests_finding_the_copy_stale_together_read_the_inventory_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = blazar_db::Store::connect(&blazar_db::StoreOptions {
            url: dir.path().join("cache.db").display().to_string(),
            max_connections: 16,
            ..Default::default()
        })
        .await
        .unwrap();
        let mut tx = store.write().await.unwrap();
        for i in 0..500 {
            let rack = format!("r{}", i / 10);
            let host = sized_host(i, 8, &[("rack", &rack)]);
            tx.insert_host(&host).await.unwrap();
        }
        tx.commit().await.unwrap();
        let cache = Arc::new(HostCache::default());
        let start = Arc::new(tokio::sync::Barrier::new(16));
        let readers: Vec<_> = (0..16)
            .map(|_| {
                let (store, cache, start) = (store.clone(), cache.clone(), start.clone());
                tokio::spawn(async move {
                    let mut tx = store.read().await.unwrap();
                    start.wait().await;
                    let hosts = cache.inventory(&mut tx).await.unwrap().hosts.len();
                    tx.commit().await.unwrap();
                    hosts
                })
            })
            .collect();
        for reader in readers {
            assert_eq!(reader.await.unwrap(), 500);
        }
        assert_eq!(cache.loads(), 1);
        // A change moves the version: the next request reads the inventory again.
        let mut tx = store.write().await.unwrap();
        tx.set_host_health(1, false, Some("down"), chrono::Utc::now())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let mut tx = store.read().await.unwrap();
        cache.inventory(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(cache.loads(), 2);
    }

    fn sized_host(i: i64, vcpus: i64, capabilities: &[(&str, &str)]) -> blazar_db::NewHost {
        blazar_db::NewHost {
            facts: blazar_core::HostFacts {
                hypervisor_hostname: format!("h{i}"),
                service_name: format!("h{i}"),
                hypervisor_type: "QEMU".into(),
                hypervisor_version: 1,
                vcpus,
                memory_mb: 4096,
                local_gb: 100,
                cpu_info: "{}".into(),
                availability_zone: "nova".into(),
            },
            trust_id: String::new(),
            capabilities: capabilities
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created_at: chrono::Utc::now(),
        }
    }

    #[tokio::test]
    async fn fitting_hosts_are_remembered_per_size_and_ratios_and_never_stale() {
        use blazar_core::engine::Usage;
        let dir = tempfile::tempdir().unwrap();
        let store = blazar_db::Store::connect(&blazar_db::StoreOptions {
            url: dir.path().join("fits.db").display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap();
        let mut tx = store.write().await.unwrap();
        // Hosts of 1 to 8 vCPUs (host id n has (n - 1) % 8 + 1); h1 (id 2, 2 vCPUs)
        // triples its own CPU.
        for i in 0..40 {
            let ratio: &[(&str, &str)] = if i == 1 {
                &[("cpu_allocation_ratio", "3.0")]
            } else {
                &[]
            };
            tx.insert_host(&sized_host(i, i % 8 + 1, ratio))
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        let cache = HostCache::default();
        let any = Query::default();
        let slot = |vcpus| Usage {
            vcpus,
            memory_mb: 512,
            disk_gb: 10,
        };
        let ratios = crate::instance::Ratios {
            cpu: 1.0,
            ram: 1.0,
            disk: 1.0,
        };
        let fitting = |vcpus: i64, ratios| {
            let (store, cache, any) = (&store, &cache, &any);
            async move {
                let mut tx = store.read().await.unwrap();
                let queries = [("resource_properties", any)];
                let found = cache
                    .fitting(&mut tx, &queries, "", slot(vcpus), ratios)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                found
            }
        };
        let names = |fits: &Fitting| -> Vec<(i64, i64)> {
            fits.iter().map(|(id, cap)| (*id, cap.vcpus)).collect()
        };
        let four = fitting(4, ratios).await;
        // Hosts of 4 vCPUs or more (ids 4..=8, 12..=16, ...), and h1 at 2 x 3.
        assert_eq!(four.len(), 26);
        assert!(names(&four).contains(&(4, 4)), "{:?}", names(&four));
        assert!(names(&four).contains(&(2, 6)), "{:?}", names(&four));
        assert!(four.iter().all(|(_, cap)| cap.vcpus >= 4));
        assert!(four.windows(2).all(|w| w[0].0 < w[1].0), "id order");
        // Asked again, the same list answers.
        assert!(Arc::ptr_eq(&four, &fitting(4, ratios).await));
        // Another size, or other default ratios, is another list.
        assert_eq!(fitting(8, ratios).await.len(), 5);
        let doubled = crate::instance::Ratios { cpu: 2.0, ..ratios };
        let four_doubled = fitting(4, doubled).await;
        assert_eq!(four_doubled.len(), 35);
        // h1 sets its own ratio: the default does not change it.
        assert!(names(&four_doubled).contains(&(2, 6)));
        assert!(names(&four_doubled).contains(&(4, 8)));
        // A new host moves the inventory version: it is found at once.
        let mut tx = store.write().await.unwrap();
        let id = tx.insert_host(&sized_host(99, 32, &[])).await.unwrap();
        tx.commit().await.unwrap();
        let eight = fitting(8, ratios).await;
        assert_eq!(eight.len(), 6);
        assert_eq!(eight.last().map(|(h, _)| *h), Some(id));
    }
}
