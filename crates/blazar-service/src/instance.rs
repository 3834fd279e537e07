//! Instance capacity on hosts: `virtual:instance` (a size per instance) and `flavor:instance`
//! (the size of a registered flavor). Slots are shared allocations of hosts: they never
//! exclude each other, only whole-host reservations, and their sum never exceeds a host's
//! capacity (its totals times its allocation ratios) at any instant of the window.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use blazar_core::Flavor;
pub use blazar_core::engine::{HostSlots, place};
use blazar_core::engine::{Usage, free_slots, peak_usage, probe_ends};
use blazar_core::host::HostRecord;
use blazar_core::reservation::{FlavorChoice, FoundFlavor, ReservationSpec, SourceFlavor};
use blazar_core::{Occupancy, PHYSICAL_HOST, TimeWindow};
use blazar_db::{AllocationUsage, Backend, NewAllocation, Tx};
use serde_json::Value;

pub use blazar_core::reservation::{Affinity, FLAVOR_INSTANCE, VIRTUAL_INSTANCE};

use crate::resources::{AllocationRequest, Fitting, Grant, HostCache, filter_key, lock_reservable};
use crate::{ServiceError, ServiceResult};

/// Extra capabilities that set a host's allocation ratios.
pub const RATIO_KEYS: [&str; 3] = [
    "cpu_allocation_ratio",
    "ram_allocation_ratio",
    "disk_allocation_ratio",
];

/// An allocation ratio as a capability writes it: a finite number above 0, or none.
pub fn ratio(text: &str) -> Option<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r > 0.0)
}

/// Default allocation ratios when a host sets none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratios {
    pub cpu: f64,
    pub ram: f64,
    pub disk: f64,
}

impl Default for Ratios {
    fn default() -> Self {
        Ratios {
            cpu: 1.0,
            ram: 1.0,
            disk: 1.0,
        }
    }
}

/// What the cloud answered last for each set of `trait:` requirements: the hypervisor
/// hostnames of the hosts that satisfy it (Placement's `required=` query). Asked before the
/// transaction of each `flavor:instance` create, so a create sees traits as they are now;
/// healing uses the latest answer. A set the cloud was never asked about falls back to the
/// hosts' extra capabilities (`<TRAIT>=true`, the custom traits copied at enrolment).
#[derive(Default)]
pub struct TraitHosts(std::sync::Mutex<HashMap<TraitSet, Arc<HashSet<String>>>>);

/// Trait names, each required (true) or forbidden (false), sorted.
type TraitSet = Vec<(String, bool)>;

/// Distinct trait sets remembered; flavors are few, so this is only a bound.
const TRAIT_SETS_KEPT: usize = 1024;

impl TraitHosts {
    fn key(traits: &[(String, bool)]) -> TraitSet {
        let mut key = traits.to_vec();
        key.sort();
        key.dedup();
        key
    }

    pub fn remember(&self, traits: &[(String, bool)], hosts: HashSet<String>) {
        if let Ok(mut known) = self.0.lock() {
            if known.len() >= TRAIT_SETS_KEPT {
                known.clear();
            }
            known.insert(Self::key(traits), Arc::new(hosts));
        }
    }

    pub fn hosts(&self, traits: &[(String, bool)]) -> Option<Arc<HashSet<String>>> {
        if traits.is_empty() {
            return None;
        }
        self.0.lock().ok()?.get(&Self::key(traits)).cloned()
    }

    /// Every trait set asked about so far, for a refresh.
    pub fn known(&self) -> Vec<TraitSet> {
        self.0
            .lock()
            .map(|k| k.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// A host's capacity for instances: totals times ratios.
pub fn capacity(host: &HostRecord, defaults: Ratios) -> Usage {
    HostRatios::of(host).capacity(host, defaults)
}

/// The allocation ratios a host sets for itself (capabilities `RATIO_KEYS`), where valid.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostRatios([Option<f64>; 3]);

impl HostRatios {
    pub fn of(host: &HostRecord) -> HostRatios {
        HostRatios(RATIO_KEYS.map(|key| host.capabilities.get(key).and_then(|v| ratio(v))))
    }

    /// `host`'s capacity with these ratios, `defaults` where it sets none.
    pub fn capacity(self, host: &HostRecord, defaults: Ratios) -> Usage {
        let [cpu, ram, disk] = self.0;
        let scale = |total: i64, r: f64| (total as f64 * r).floor() as i64;
        Usage {
            vcpus: scale(host.facts.vcpus, cpu.unwrap_or(defaults.cpu)),
            memory_mb: scale(host.facts.memory_mb, ram.unwrap_or(defaults.ram)),
            disk_gb: scale(host.facts.local_gb, disk.unwrap_or(defaults.disk)),
        }
    }
}

/// An instance request, whatever type it came from.
pub(crate) struct Shape {
    pub(crate) slot: Usage,
    pub(crate) amount: i64,
    pub(crate) affinity: Affinity,
    queries: Vec<(&'static str, blazar_core::reservation::Query)>,
    /// Capabilities a host must have (true) or must not have (false).
    traits: Vec<(String, bool)>,
    /// The hosts the cloud says satisfy `traits`, when it was asked.
    trait_hosts: Option<Arc<HashSet<String>>>,
    /// The filter's cache key.
    key: String,
}

impl Shape {
    /// The shape of an instance reservation, with what the cloud last said of its traits.
    pub(crate) fn of(spec: &ReservationSpec, trait_hosts: &TraitHosts) -> ServiceResult<Shape> {
        match spec {
            ReservationSpec::Instance(i) => {
                let queries = vec![("resource_properties", i.resource_properties.clone())];
                let key = filter_key(&[("resource_properties", &i.resource_properties)]);
                Ok(Shape {
                    slot: i.size,
                    amount: i64::from(i.amount),
                    affinity: i.affinity,
                    queries,
                    traits: Vec::new(),
                    trait_hosts: None,
                    key,
                })
            }
            ReservationSpec::FlavorInstance(f) => {
                let FlavorChoice::Found(found) = &f.flavor else {
                    return Err(ServiceError::Internal(
                        "flavor:instance reservation without its flavor".into(),
                    ));
                };
                Ok(Shape {
                    slot: found.size,
                    amount: i64::from(f.amount),
                    affinity: f.affinity,
                    queries: Vec::new(),
                    traits: found.traits.clone(),
                    trait_hosts: trait_hosts.hosts(&found.traits),
                    key: String::new(),
                })
            }
            other => Err(ServiceError::Internal(format!(
                "{} is not an instance reservation",
                other.resource_type()
            ))),
        }
    }
}

/// The hosts an instance shape may use, with their capacity (totals times ratios): those
/// that match its queries and traits and could hold one instance when empty, in id order.
pub(crate) async fn shape_hosts(
    tx: &mut Tx,
    shape: &Shape,
    ratios: Ratios,
    cache: &HostCache,
) -> ServiceResult<Fitting> {
    let queries: Vec<(&str, &blazar_core::reservation::Query)> =
        shape.queries.iter().map(|(f, q)| (*f, q)).collect();
    if shape.traits.is_empty() {
        return cache
            .fitting(tx, &queries, &shape.key, shape.slot, ratios)
            .await;
    }
    // Which hosts have a trait is the cloud's answer of the moment: not remembered with
    // the inventory.
    let (inventory, matching) = cache.matching(tx, &queries, &shape.key).await?;
    Ok(Arc::new(
        inventory
            .fitting(&matching, ratios, shape.slot)
            .filter(|(host, _)| match &shape.trait_hosts {
                Some(hosts) => hosts.contains(&host.facts.hypervisor_hostname),
                None => shape
                    .traits
                    .iter()
                    .all(|(name, required)| has_trait(host, name) == *required),
            })
            .map(|(host, cap)| (host.id, cap))
            .collect(),
    ))
}

/// Free slots per candidate host for `slot`-sized instances over the request's window, read
/// for every candidate at once (healing, which is rare and wants the best host anywhere);
/// the slots of `own` count as free (see [`slots_of`]).
async fn host_slots(
    tx: &mut Tx,
    shape: &Shape,
    request: &AllocationRequest<'_>,
    ratios: Ratios,
    cache: &HostCache,
    own: &HashMap<i64, i64>,
) -> ServiceResult<(Vec<HostSlots>, usize)> {
    let hosts = shape_hosts(tx, shape, ratios, cache).await?;
    let overlapping = tx
        .usage_overlapping(PHYSICAL_HOST, request.window.start(), request.blocked_until)
        .await?;
    let slots = slots_of(&hosts, &overlapping, shape, request, own)?;
    Ok((slots, hosts.len()))
}

/// The free slots of `hosts` given the allocations that overlap the request's window, one
/// entry per host in their order (zero slots for a host held whole). `own` (per host: slots
/// of the shape's size the reservation holds over the whole window) counts as free: held
/// throughout, they add the same to every instant, so the peak without them is the peak
/// less them (exact for a host over its capacity too, where adding them to its free slots,
/// floored at zero, would not be).
fn slots_of(
    hosts: &[(i64, Usage)],
    overlapping: &[AllocationUsage],
    shape: &Shape,
    request: &AllocationRequest<'_>,
    own: &HashMap<i64, i64>,
) -> ServiceResult<Vec<HostSlots>> {
    let window = TimeWindow::new(request.window.start(), request.blocked_until)
        .map_err(|e| ServiceError::Internal(e.to_string()))?;
    let mut exclusive = HashSet::new();
    let mut shared: HashMap<i64, Vec<(TimeWindow, Usage)>> = HashMap::new();
    for a in overlapping {
        if a.exclusive {
            exclusive.insert(a.resource_id);
        } else if let Ok(w) = TimeWindow::new(a.start, a.blocked_until) {
            shared
                .entry(a.resource_id)
                .or_default()
                .push((w, a.usage()));
        }
    }
    Ok(hosts
        .iter()
        .map(|&(id, cap)| {
            if exclusive.contains(&id) {
                return HostSlots {
                    host: id,
                    slots: 0,
                    in_use: true,
                };
            }
            let mut used = shared
                .get(&id)
                .map(|v| peak_usage(v, &window))
                .unwrap_or_default();
            if let Some(&units) = own.get(&id) {
                used = used.less(shape.slot.times(units));
            }
            HostSlots {
                host: id,
                slots: free_slots(cap, used, shape.slot),
                in_use: shared.contains_key(&id),
            }
        })
        .collect())
}

/// Where a new or changed instance reservation goes: the candidates are read probe by probe
/// (the hosts it keeps, then in id order, `engine::probe_ends`) and the search stops at the
/// first probe in which the instances fit, so that a large site reads the usage of a few
/// dozen hosts rather than of every host. The offer search places with the same probes
/// (`engine::place_in_batches`), so an offer is granted the hosts it named. Returns the
/// placement (or `None`), the slots read and how many hosts fit one instance.
async fn probe_slots(
    tx: &mut Tx,
    shape: &Shape,
    request: &AllocationRequest<'_>,
    ratios: Ratios,
    cache: &HostCache,
) -> ServiceResult<(Option<Vec<(i64, i64)>>, Vec<HostSlots>, usize)> {
    let hosts = shape_hosts(tx, shape, ratios, cache).await?;
    let fitting = hosts.len();
    // The kept hosts first, the others still in id order (a new reservation keeps none:
    // the remembered list is used as it is).
    let order: std::borrow::Cow<'_, [(i64, Usage)]> = if request.keep.is_empty() {
        std::borrow::Cow::Borrowed(hosts.as_slice())
    } else {
        let (mut kept, others): (Vec<_>, Vec<_>) =
            hosts.iter().partition(|(id, _)| request.keep.contains(id));
        kept.extend(others);
        std::borrow::Cow::Owned(kept)
    };
    let kept = order
        .iter()
        .filter(|(id, _)| request.keep.contains(id))
        .count();
    let mut slots: Vec<HostSlots> = Vec::with_capacity(order.len());
    for end in probe_ends(kept, order.len()) {
        let probe = &order[slots.len()..end];
        let ids: Vec<i64> = probe.iter().map(|(id, _)| *id).collect();
        let overlapping = request.usage_among(tx, PHYSICAL_HOST, &ids).await?;
        slots.extend(slots_of(
            probe,
            &overlapping,
            shape,
            request,
            &HashMap::new(),
        )?);
        if let Some(placement) = place(&slots, request.keep, shape.amount, shape.affinity) {
            return Ok((Some(placement), slots, fitting));
        }
    }
    Ok((None, slots, fitting))
}

/// Writes the slots of `placement`. On PostgreSQL the placed hosts are claimed first
/// (waiting, in id order, for writers placing on them now) and their use read again: the
/// exclusion constraint keeps whole hosts apart but does not add up shared capacity, so
/// this check is what keeps two concurrent placements from overfilling one host. A host
/// that no longer has room sends the transaction round again.
async fn write_slots(
    tx: &mut Tx,
    shape: &Shape,
    request: &AllocationRequest<'_>,
    placement: &[(i64, i64)],
    ratios: Ratios,
    cache: &HostCache,
) -> ServiceResult<()> {
    let hosts: Vec<i64> = placement.iter().map(|(h, _)| *h).collect();
    if tx.backend() == Backend::Postgres {
        tx.claim_resources(PHYSICAL_HOST, &hosts).await?;
        let chosen: HashSet<i64> = hosts.iter().copied().collect();
        let capacity: HashMap<i64, Usage> = shape_hosts(tx, shape, ratios, cache)
            .await?
            .iter()
            .filter(|(id, _)| chosen.contains(id))
            .copied()
            .collect();
        let placed: Vec<(i64, Usage)> = hosts
            .iter()
            .map(|id| (*id, capacity.get(id).copied().unwrap_or_default()))
            .collect();
        let now = request.usage_among(tx, PHYSICAL_HOST, &hosts).await?;
        let room = slots_of(&placed, &now, shape, request, &HashMap::new())?;
        let full = placement
            .iter()
            .zip(&room)
            .any(|((_, units), free)| free.slots < *units);
        if full {
            return Err(ServiceError::Retry(
                "a chosen host was filled concurrently".into(),
            ));
        }
    }
    if lock_reservable(tx, PHYSICAL_HOST, &hosts).await?.len() != hosts.len() {
        return Err(ServiceError::Retry(
            "a chosen host changed concurrently".into(),
        ));
    }
    let rows: Vec<NewAllocation> = placement
        .iter()
        .map(|(host, units)| {
            let whole = crate::resources::whole_allocation(request, PHYSICAL_HOST, *host);
            NewAllocation {
                occupancy: Occupancy {
                    exclusive: false,
                    units: *units,
                    vcpus: shape.slot.vcpus,
                    memory_mb: shape.slot.memory_mb,
                    disk_gb: shape.slot.disk_gb,
                    ..whole.occupancy
                },
                ..whole
            }
        })
        .collect();
    tx.insert_allocations(&rows).await?;
    Ok(())
}

pub(crate) async fn allocate_shape(
    tx: &mut Tx,
    shape: &Shape,
    request: &AllocationRequest<'_>,
    ratios: Ratios,
    cache: &HostCache,
    kind: &str,
) -> ServiceResult<Grant> {
    let (placement, slots, fitting) = probe_slots(tx, shape, request, ratios, cache).await?;
    let placement = placement.ok_or_else(|| {
        let free = slots
            .iter()
            .fold(0i64, |total, s| total.saturating_add(s.slots));
        let counts = (fitting, usize::try_from(free).unwrap_or(0));
        request.shortfall(kind, crate::resources::NOT_ENOUGH_HOSTS, counts, |window| {
            let placement_rule = match shape.affinity {
                Affinity::Same => ", all on one host",
                Affinity::Different => ", each on a different host",
                Affinity::Any => "",
            };
            format!(
                "Not enough hosts available for reservation {} ({kind}, {} instance(s) of {} \
                 vCPU, {} MB RAM, {} GB disk{placement_rule}): {fitting} host(s) match the \
                 filters and fit one instance, with {free} free slot(s) on {} host(s) {window}",
                request.named,
                shape.amount,
                shape.slot.vcpus,
                shape.slot.memory_mb,
                shape.slot.disk_gb,
                slots.iter().filter(|s| s.slots > 0).count(),
            )
        })
    })?;
    write_slots(tx, shape, request, &placement, ratios, cache).await?;
    Ok(Grant {
        resources: placement.iter().map(|(h, _)| *h).collect(),
        units: shape.amount,
    })
}

/// Healing for instance slots: up to `missing` more slots wherever they fit, as many as do.
/// With affinity all of them or none, and the reservation's remaining slots are moved too,
/// so all stay on one host. Returns the slots added.
pub(crate) async fn refill_shape(
    tx: &mut Tx,
    shape: &Shape,
    request: &AllocationRequest<'_>,
    ratios: Ratios,
    cache: &HostCache,
    missing: i64,
) -> ServiceResult<i64> {
    let mut wanted = Shape {
        slot: shape.slot,
        amount: missing,
        affinity: if shape.affinity == Affinity::Same {
            Affinity::Same
        } else {
            Affinity::Any
        },
        queries: shape.queries.clone(),
        traits: shape.traits.clone(),
        trait_hosts: shape.trait_hosts.clone(),
        key: shape.key.clone(),
    };
    let mut own_slots: HashMap<i64, i64> = HashMap::new();
    if shape.affinity == Affinity::Same {
        // Every slot on one host: the search counts the slots the reservation holds now as
        // free on their host, and they are let go only once a host for all of them is found
        // (a reservation left with nothing would lose the servers it has). Only what covers
        // the whole window, of the same size, counts (see `host_slots`).
        wanted.amount = shape.amount;
        for a in tx.allocations_of_lease(request.lease_id).await? {
            let o = &a.occupancy;
            let same_size = Usage {
                vcpus: o.vcpus,
                memory_mb: o.memory_mb,
                disk_gb: o.disk_gb,
            } == shape.slot;
            if a.reservation_id == request.reservation_id
                && a.resource_type == PHYSICAL_HOST
                && !o.exclusive
                && same_size
                && o.start <= request.window.start()
                && o.blocked_until >= request.blocked_until
            {
                *own_slots.entry(a.resource_id).or_default() += o.units;
            }
        }
    }
    let (slots, _) = host_slots(tx, &wanted, request, ratios, cache, &own_slots).await?;
    let available: Vec<HostSlots> = if shape.affinity == Affinity::Different {
        // Distinct hosts: skip the ones the reservation already uses.
        slots
            .into_iter()
            .filter(|s| !request.keep.contains(&s.host))
            .map(|s| HostSlots {
                slots: s.slots.min(1),
                ..s
            })
            .collect()
    } else {
        slots
    };
    let placement = place(&available, &[], wanted.amount, wanted.affinity).or_else(|| {
        // Spread slots take what is free now, the rest awaited with the lease degraded, as
        // host reservations do: a reservation that lost two hosts gets one slot back as
        // soon as one host returns. Slots on one host come back all together or not at all.
        if shape.affinity == Affinity::Same {
            return None;
        }
        let free = available
            .iter()
            .map(|s| s.slots.max(0))
            .fold(0i64, i64::saturating_add)
            .min(wanted.amount);
        (free > 0)
            .then(|| place(&available, &[], free, wanted.affinity))
            .flatten()
    });
    let Some(placement) = placement else {
        return Ok(0);
    };
    if shape.affinity == Affinity::Same {
        tx.delete_allocations_of_reservation(request.reservation_id)
            .await?;
    }
    write_slots(tx, &wanted, request, &placement, ratios, cache).await?;
    if shape.affinity == Affinity::Same {
        return Ok(missing);
    }
    Ok(placement.iter().map(|(_, units)| *units).sum())
}

/// A flavor the cloud gave, checked as a registered one is.
pub(crate) fn found_in_cloud(flavor: &Value) -> ServiceResult<FoundFlavor> {
    let source = SourceFlavor::from_json(flavor).ok_or_else(|| {
        ServiceError::Unavailable(format!("the cloud's flavor is malformed: {flavor}"))
    })?;
    Ok(FoundFlavor::new(source)?)
}

/// Finds the flavor a `flavor:instance` spec names among the registered flavors (one the
/// cloud gave was found before the transaction).
pub(crate) async fn resolve_flavor(tx: &mut Tx, spec: &mut ReservationSpec) -> ServiceResult<()> {
    let ReservationSpec::FlavorInstance(f) = spec else {
        return Ok(());
    };
    let FlavorChoice::Named(requested) = &f.flavor else {
        return Ok(());
    };
    // A 404 in Nova's words, as Blazar (and the OpenStack backend) answer, then what to do.
    let flavor = tx.find_flavor(requested).await?.ok_or_else(|| {
        ServiceError::NotFound(format!(
            "Flavor {requested} could not be found. Register it with POST /v1/flavors or \
             use the id or name of a registered flavor."
        ))
    })?;
    f.flavor = FlavorChoice::Found(FoundFlavor::new(flavor.source)?);
    Ok(())
}

/// Whether a registered flavor is one an instance reservation could take: its size and its
/// trait requirements are well-formed.
pub(crate) fn check_flavor(flavor: &Flavor) -> ServiceResult<()> {
    FoundFlavor::new(flavor.source.clone())?;
    Ok(())
}

/// Whether `host` has trait `name`: a capability of that name set to true (`true` in any
/// case, or `1`, as a JSON `true` is stored).
pub(crate) fn has_trait(host: &HostRecord, name: &str) -> bool {
    host.capabilities
        .get(name)
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(host: i64, slots: i64, in_use: bool) -> HostSlots {
        HostSlots {
            host,
            slots,
            in_use,
        }
    }

    #[test]
    fn placement_table() {
        let hosts = [h(1, 2, false), h(2, 4, false), h(3, 1, true)];
        type Row<'a> = (i64, Affinity, &'a [i64], Option<Vec<(i64, i64)>>);
        let rows: Vec<Row> = vec![
            (1, Affinity::Same, &[], Some(vec![(3, 1)])),
            (3, Affinity::Same, &[], Some(vec![(2, 3)])),
            (5, Affinity::Same, &[], None),
            (2, Affinity::Same, &[1], Some(vec![(1, 2)])),
            (
                3,
                Affinity::Different,
                &[],
                Some(vec![(3, 1), (1, 1), (2, 1)]),
            ),
            (4, Affinity::Different, &[], None),
            (7, Affinity::Any, &[], Some(vec![(3, 1), (1, 2), (2, 4)])),
            (8, Affinity::Any, &[], None),
            (3, Affinity::Any, &[2], Some(vec![(2, 3)])),
            // Held one slot on each of 1 and 2: both stay, though 2 alone has room for all.
            (2, Affinity::Any, &[1, 2], Some(vec![(1, 1), (2, 1)])),
            (4, Affinity::Any, &[1, 2], Some(vec![(1, 2), (2, 2)])),
            // Two held on 2, one on 1; one more goes where it fits first.
            (4, Affinity::Any, &[2, 1, 2], Some(vec![(1, 2), (2, 2)])),
            // Fewer than held (a shrink): the kept hosts in order.
            (1, Affinity::Any, &[1, 2], Some(vec![(1, 1)])),
        ];
        for (amount, affinity, keep, expected) in rows {
            assert_eq!(
                place(&hosts, keep, amount, affinity),
                expected,
                "{amount} {affinity:?} keep {keep:?}"
            );
        }
    }

    #[test]
    fn capacity_applies_ratios() {
        let mut host = HostRecord {
            id: 1,
            facts: blazar_core::HostFacts {
                hypervisor_hostname: "h".into(),
                service_name: "h".into(),
                hypervisor_type: "QEMU".into(),
                hypervisor_version: 0,
                vcpus: 8,
                memory_mb: 16384,
                local_gb: 100,
                cpu_info: String::new(),
                availability_zone: String::new(),
            },
            reservable: true,
            status: None,
            trust_id: String::new(),
            capabilities: Default::default(),
            created_at: chrono::Utc::now(),
            updated_at: None,
        };
        assert_eq!(
            capacity(&host, Ratios::default()),
            Usage {
                vcpus: 8,
                memory_mb: 16384,
                disk_gb: 100
            }
        );
        let defaults = Ratios {
            cpu: 4.0,
            ram: 1.5,
            disk: 1.0,
        };
        assert_eq!(
            capacity(&host, defaults),
            Usage {
                vcpus: 32,
                memory_mb: 24576,
                disk_gb: 100
            }
        );
        host.capabilities
            .insert("cpu_allocation_ratio".into(), "2".into());
        host.capabilities
            .insert("disk_allocation_ratio".into(), "nonsense".into());
        assert_eq!(
            capacity(&host, defaults),
            Usage {
                vcpus: 16,
                memory_mb: 24576,
                disk_gb: 100
            }
        );

        // The inventory finds the hosts asked for, in one walk or by id, with the same
        // capacities.
        let hosts: Vec<HostRecord> = [2, 3, 5, 8, 9]
            .into_iter()
            .map(|id| {
                let mut h = host.clone();
                h.id = id;
                h.facts.vcpus = id;
                h
            })
            .collect();
        let inventory = crate::resources::Inventory::new(hosts);
        let found = |ids: &[i64]| -> Vec<(i64, i64)> {
            inventory
                .with_capacity(ids, defaults)
                .map(|(h, cap)| (h.id, cap.vcpus))
                .collect()
        };
        assert_eq!(found(&[1, 3, 4, 5, 9, 10]), [(3, 6), (5, 10), (9, 18)]);
        assert_eq!(found(&[2, 3, 5, 8, 9]).len(), 5);
        assert_eq!(found(&[9, 2]), [(9, 18), (2, 4)]);
        assert!(found(&[]).is_empty());
    }
}
