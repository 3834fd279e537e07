//! Instance capacity on hosts: `virtual:instance` (a size per instance) and `flavor:instance`
//! (the size of a registered flavor). Slots are shared allocations of hosts: they never
//! exclude each other, only whole-host reservations, and their sum never exceeds a host's
//! capacity (its totals times its allocation ratios) at any instant of the window.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use blazar_core::engine::{Usage, free_slots, peak_usage};
use blazar_core::host::HostRecord;
use blazar_core::{PHYSICAL_HOST, PropertyQuery, TimeWindow};
use blazar_db::{FlavorRow, NewAllocation, Tx};
use serde_json::{Map, Value, json};

use crate::resources::{
    AllocationRequest, Grant, HostCache, ResourceType, int_field, lock_reservable, query_field,
};
use crate::resources::{check_fields, merge_fields};
use crate::{ServiceError, ServiceResult};

pub const VIRTUAL_INSTANCE: &str = "virtual:instance";
pub const FLAVOR_INSTANCE: &str = "flavor:instance";

/// Where a validated `flavor:instance` request carries the flavor the cloud gave for it
/// (Nova's shape), until it is resolved into the reservation's fields.
pub(crate) const CLOUD_FLAVOR: &str = "cloud_flavor";

/// Extra capabilities that set a host's allocation ratios.
pub const RATIO_KEYS: [&str; 3] = [
    "cpu_allocation_ratio",
    "ram_allocation_ratio",
    "disk_allocation_ratio",
];

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
    let ratio = |key: &str, default: f64| {
        host.capabilities
            .get(key)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|r| r.is_finite() && *r > 0.0)
            .unwrap_or(default)
    };
    let scale = |total: i64, r: f64| (total as f64 * r).floor() as i64;
    Usage {
        vcpus: scale(host.facts.vcpus, ratio(RATIO_KEYS[0], defaults.cpu)),
        memory_mb: scale(host.facts.memory_mb, ratio(RATIO_KEYS[1], defaults.ram)),
        disk_gb: scale(host.facts.local_gb, ratio(RATIO_KEYS[2], defaults.disk)),
    }
}

/// Placement of instances across hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// All on one host.
    Same,
    /// All on distinct hosts.
    Different,
    /// Anywhere.
    Any,
}

impl Affinity {
    fn parse(value: Option<&Value>) -> ServiceResult<Affinity> {
        let bad = || {
            ServiceError::BadRequest(format!(
                "Malformed parameter affinity (must be a bool value or None), got {}",
                value.map(Value::to_string).unwrap_or_default()
            ))
        };
        match value {
            None | Some(Value::Null) => Ok(Affinity::Any),
            Some(Value::Bool(true)) => Ok(Affinity::Same),
            Some(Value::Bool(false)) => Ok(Affinity::Different),
            Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
                "none" | "" => Ok(Affinity::Any),
                "true" | "yes" | "1" | "on" | "t" | "y" => Ok(Affinity::Same),
                "false" | "no" | "0" | "off" | "f" | "n" => Ok(Affinity::Different),
                _ => Err(bad()),
            },
            Some(_) => Err(bad()),
        }
    }

    fn to_value(self) -> Value {
        match self {
            Affinity::Same => Value::Bool(true),
            Affinity::Different => Value::Bool(false),
            Affinity::Any => Value::Null,
        }
    }
}

/// One host's free slots in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSlots {
    pub host: i64,
    pub slots: i64,
    /// Whether other instance reservations already use the host in the window (packing
    /// prefers those, keeping empty hosts whole for host reservations).
    pub in_use: bool,
}

/// Spreads `amount` instances over hosts by affinity. `keep` lists hosts the reservation
/// uses already, preferred. Returns (host, units) or `None` when they do not fit.
pub fn place(
    candidates: &[HostSlots],
    keep: &[i64],
    amount: i64,
    affinity: Affinity,
) -> Option<Vec<(i64, i64)>> {
    let mut ordered: Vec<HostSlots> = candidates.iter().copied().filter(|c| c.slots > 0).collect();
    ordered.sort_by_key(|c| (!keep.contains(&c.host), !c.in_use, c.host));
    match affinity {
        Affinity::Same => ordered
            .iter()
            .find(|c| c.slots >= amount)
            .map(|c| vec![(c.host, amount)]),
        Affinity::Different => (ordered.len() as i64 >= amount).then(|| {
            ordered
                .iter()
                .take(amount as usize)
                .map(|c| (c.host, 1))
                .collect()
        }),
        Affinity::Any => {
            let mut left = amount;
            let mut out = Vec::new();
            for c in &ordered {
                if left == 0 {
                    break;
                }
                let take = c.slots.min(left);
                out.push((c.host, take));
                left -= take;
            }
            (left == 0).then_some(out)
        }
    }
}

/// An instance request, whatever type it came from.
struct Shape {
    slot: Usage,
    amount: i64,
    affinity: Affinity,
    queries: Vec<(&'static str, Option<PropertyQuery>)>,
    /// Capabilities a host must have (true) or must not have (false).
    traits: Vec<(String, bool)>,
    /// The hosts the cloud says satisfy `traits`, when it was asked.
    trait_hosts: Option<Arc<HashSet<String>>>,
    /// The filter's cache key.
    key: String,
}

/// Free slots per candidate host for `slot`-sized instances over the request's window.
async fn host_slots(
    tx: &mut Tx,
    shape: &Shape,
    request: &AllocationRequest<'_>,
    ratios: Ratios,
    cache: &HostCache,
) -> ServiceResult<(Vec<HostSlots>, usize)> {
    tx.lock_allocations().await?;
    let queries: Vec<(&str, &Option<PropertyQuery>)> =
        shape.queries.iter().map(|(f, q)| (*f, q)).collect();
    let (inventory, matching) = cache.matching(tx, &queries, &shape.key).await?;
    let window = TimeWindow::new(request.window.start(), request.blocked_until)
        .map_err(|e| ServiceError::Internal(e.to_string()))?;
    let overlapping = tx
        .usage_overlapping(PHYSICAL_HOST, request.window.start(), request.blocked_until)
        .await?;
    let mut exclusive = std::collections::HashSet::new();
    let mut shared: HashMap<i64, Vec<(TimeWindow, Usage)>> = HashMap::new();
    for a in &overlapping {
        if a.exclusive {
            exclusive.insert(a.resource_id);
        } else if let Ok(w) = TimeWindow::new(a.start, a.blocked_until) {
            let usage = Usage {
                vcpus: a.vcpus,
                memory_mb: a.memory_mb,
                disk_gb: a.disk_gb,
            }
            .times(a.units);
            shared.entry(a.resource_id).or_default().push((w, usage));
        }
    }
    let mut fitting = 0;
    let mut out = Vec::new();
    for &id in matching.iter() {
        let Some(host) = inventory.get(id) else {
            continue;
        };
        let traits_hold = match &shape.trait_hosts {
            Some(hosts) => hosts.contains(&host.facts.hypervisor_hostname),
            None => shape
                .traits
                .iter()
                .all(|(name, required)| has_trait(host, name) == *required),
        };
        if !traits_hold {
            continue;
        }
        let cap = capacity(host, ratios);
        if free_slots(cap, Usage::default(), shape.slot) == 0 {
            continue;
        }
        fitting += 1;
        if exclusive.contains(&id) {
            continue;
        }
        let used = shared
            .get(&id)
            .map(|v| peak_usage(v, &window))
            .unwrap_or_default();
        out.push(HostSlots {
            host: id,
            slots: free_slots(cap, used, shape.slot),
            in_use: shared.contains_key(&id),
        });
    }
    Ok((out, fitting))
}

async fn write_slots(
    tx: &mut Tx,
    shape: &Shape,
    request: &AllocationRequest<'_>,
    placement: &[(i64, i64)],
) -> ServiceResult<()> {
    let hosts: Vec<i64> = placement.iter().map(|(h, _)| *h).collect();
    if lock_reservable(tx, PHYSICAL_HOST, &hosts).await?.len() != hosts.len() {
        return Err(ServiceError::Retry(
            "a chosen host changed concurrently".into(),
        ));
    }
    let rows: Vec<NewAllocation> = placement
        .iter()
        .map(|(host, units)| NewAllocation {
            exclusive: false,
            units: *units,
            vcpus: shape.slot.vcpus,
            memory_mb: shape.slot.memory_mb,
            disk_gb: shape.slot.disk_gb,
            ..crate::resources::whole_allocation(request, PHYSICAL_HOST, *host)
        })
        .collect();
    tx.insert_allocations(&rows).await?;
    Ok(())
}

async fn allocate_shape(
    tx: &mut Tx,
    shape: &Shape,
    request: &AllocationRequest<'_>,
    ratios: Ratios,
    cache: &HostCache,
    kind: &str,
) -> ServiceResult<Grant> {
    let (slots, fitting) = host_slots(tx, shape, request, ratios, cache).await?;
    let placement = place(&slots, request.keep, shape.amount, shape.affinity).ok_or_else(|| {
        if !request.explain {
            return ServiceError::Conflict(crate::resources::NOT_ENOUGH_HOSTS.into());
        }
        let free = slots
            .iter()
            .fold(0i64, |total, s| total.saturating_add(s.slots));
        let placement_rule = match shape.affinity {
            Affinity::Same => ", all on one host",
            Affinity::Different => ", each on a different host",
            Affinity::Any => "",
        };
        ServiceError::Conflict(format!(
            "Not enough hosts available for reservation {} ({kind}, {} instance(s) of {} vCPU, {} MB \
             RAM, {} GB disk{placement_rule}): {fitting} host(s) match the filters and fit one \
             instance, with {free} free slot(s) on {} host(s) from {} to {}",
            request.ordinal,
            shape.amount,
            shape.slot.vcpus,
            shape.slot.memory_mb,
            shape.slot.disk_gb,
            slots.iter().filter(|s| s.slots > 0).count(),
            request.window.start().format("%Y-%m-%d %H:%M"),
            request.window.end().format("%Y-%m-%d %H:%M"),
        ))
    })?;
    write_slots(tx, shape, request, &placement).await?;
    Ok(Grant {
        resources: placement.iter().map(|(h, _)| *h).collect(),
        units: shape.amount,
    })
}

/// Healing for instance slots: `missing` more slots anywhere they fit. With affinity the
/// reservation's remaining slots are moved too, so all stay on one host.
async fn refill_shape(
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
    if shape.affinity == Affinity::Same {
        // Start over with every slot on one new host.
        tx.delete_allocations_of_reservation(request.reservation_id)
            .await?;
        wanted.amount = shape.amount;
    }
    let (slots, _) = host_slots(tx, &wanted, request, ratios, cache).await?;
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
    match place(&available, &[], wanted.amount, wanted.affinity) {
        Some(placement) => {
            write_slots(tx, &wanted, request, &placement).await?;
            Ok(missing)
        }
        None => Ok(0),
    }
}

fn size_field(map: &Map<String, Value>, key: &str, min: i64) -> ServiceResult<i64> {
    match map.get(key) {
        None | Some(Value::Null) => {
            Err(ServiceError::BadRequest(format!("Missing parameter {key}")))
        }
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) if v >= min && v <= i64::from(i32::MAX) => Ok(v),
            _ => Err(ServiceError::BadRequest(format!(
                "Malformed parameter {key}: must be an integer from {min} to {}, got {n}",
                i32::MAX
            ))),
        },
        Some(other) => Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: must be a JSON integer of at least {min}, got {other}"
        ))),
    }
}

/// The fields of an instance reservation, in Blazar's order, keeping the granted flavor,
/// server group and aggregate ids of `carried` (the stored reservation on an update).
fn instance_fields(
    size: Usage,
    amount: Value,
    affinity: Value,
    resource_properties: String,
    carried: Option<&Map<String, Value>>,
) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("vcpus".into(), Value::from(size.vcpus));
    out.insert("memory_mb".into(), Value::from(size.memory_mb));
    out.insert("disk_gb".into(), Value::from(size.disk_gb));
    out.insert("amount".into(), amount);
    out.insert("affinity".into(), affinity);
    out.insert(
        "resource_properties".into(),
        Value::from(resource_properties),
    );
    for key in ["flavor_id", "server_group_id", "aggregate_id"] {
        if let Some(v) = carried.and_then(|c| c.get(key)) {
            out.insert(key.into(), v.clone());
        }
    }
    out
}

/// The output fields both instance types add once the reservation has an id: the flavor it
/// grants is named after the reservation, and an affinity rule gets a server group.
fn finish(params: &mut Map<String, Value>, reservation_id: &str) {
    params.insert("flavor_id".into(), Value::from(reservation_id));
    let group = match params.get("affinity") {
        Some(Value::Bool(_)) => params
            .get("server_group_id")
            .filter(|v| v.is_string())
            .cloned()
            .unwrap_or_else(|| Value::from(uuid::Uuid::new_v4().to_string())),
        _ => Value::Null,
    };
    params.insert("server_group_id".into(), group);
    if !params.contains_key("aggregate_id") {
        params.insert("aggregate_id".into(), Value::Null);
    }
}

pub struct InstanceType {
    pub ratios: Ratios,
    pub cache: Arc<HostCache>,
}

const INSTANCE_FIELDS: &[&str] = &[
    "vcpus",
    "memory_mb",
    "disk_gb",
    "amount",
    "affinity",
    "resource_properties",
];

impl InstanceType {
    fn shape(params: &Map<String, Value>) -> ServiceResult<Shape> {
        let (_, query) = query_field(params, "resource_properties")?;
        Ok(Shape {
            slot: Usage {
                vcpus: size_field(params, "vcpus", 1)?,
                memory_mb: size_field(params, "memory_mb", 1)?,
                disk_gb: size_field(params, "disk_gb", 0)?,
            },
            amount: int_field(params, "amount")?,
            affinity: Affinity::parse(params.get("affinity"))?,
            queries: vec![("resource_properties", query)],
            traits: Vec::new(),
            trait_hosts: None,
            key: params
                .get("resource_properties")
                .map(Value::to_string)
                .unwrap_or_default(),
        })
    }
}

#[async_trait]
impl ResourceType for InstanceType {
    fn name(&self) -> &'static str {
        VIRTUAL_INSTANCE
    }

    fn kind(&self) -> &'static str {
        PHYSICAL_HOST
    }

    fn validate(
        &self,
        request: &Map<String, Value>,
        current: Option<&Map<String, Value>>,
    ) -> ServiceResult<Map<String, Value>> {
        check_fields(request, INSTANCE_FIELDS, VIRTUAL_INSTANCE)?;
        let merged = merge_fields(request, current, INSTANCE_FIELDS);
        let shape = Self::shape(&merged)?;
        let (properties, _) = query_field(&merged, "resource_properties")?;
        Ok(instance_fields(
            shape.slot,
            Value::from(shape.amount),
            shape.affinity.to_value(),
            properties,
            current,
        ))
    }

    fn finish_params(&self, params: &mut Map<String, Value>, reservation_id: &str) {
        finish(params, reservation_id);
    }

    async fn allocate(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
    ) -> ServiceResult<Grant> {
        allocate_shape(
            tx,
            &Self::shape(params)?,
            request,
            self.ratios,
            &self.cache,
            VIRTUAL_INSTANCE,
        )
        .await
    }

    async fn refill(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
        missing: i64,
    ) -> ServiceResult<i64> {
        refill_shape(
            tx,
            &Self::shape(params)?,
            request,
            self.ratios,
            &self.cache,
            missing,
        )
        .await
    }
}

pub struct FlavorInstanceType {
    pub ratios: Ratios,
    pub cache: Arc<HostCache>,
    pub trait_hosts: Arc<TraitHosts>,
}

/// `resource_properties` is taken and ignored, as Blazar takes it (it keeps the source
/// flavor there instead): Blazar's own tempest scenario sends it empty.
const FLAVOR_FIELDS: &[&str] = &["flavor_id", "amount", "affinity", "resource_properties"];

/// The instance size a flavor asks for: its vcpus, RAM and disk plus ephemeral disk, with
/// `resources:VCPU|MEMORY_MB|DISK_GB` extra specs overriding them.
pub(crate) fn flavor_size(flavor: &FlavorRow) -> ServiceResult<Usage> {
    let mut size = Usage {
        vcpus: flavor.vcpus,
        memory_mb: flavor.ram,
        disk_gb: flavor.disk.saturating_add(flavor.ephemeral),
    };
    for (key, value) in &flavor.extra_specs {
        let Some(class) = key.strip_prefix("resources:") else {
            continue;
        };
        // Placement's bounds for an amount of a resource class.
        let amount = value
            .as_str()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .or_else(|| value.as_i64())
            .filter(|v| (0..=MAX_FLAVOR_SIZE).contains(v))
            .ok_or_else(|| {
                ServiceError::BadRequest(format!(
                    "Malformed extra spec {key}={value} in flavor {}: a resource amount is an \
                     integer from 0 to {MAX_FLAVOR_SIZE}",
                    flavor.name
                ))
            })?;
        match class {
            "VCPU" | "PCPU" => size.vcpus = amount,
            "MEMORY_MB" => size.memory_mb = amount,
            "DISK_GB" => size.disk_gb = amount,
            _ => {}
        }
    }
    if !size.is_positive() {
        return Err(ServiceError::BadRequest(format!(
            "Flavor {} asks for no vCPU, memory or disk: an instance of it would fit anywhere \
             without end",
            flavor.name
        )));
    }
    Ok(size)
}

/// Largest vCPU, RAM (MB) or disk (GB) size of a flavor, as Nova's API bounds them.
pub(crate) const MAX_FLAVOR_SIZE: i64 = i32::MAX as i64;

/// `trait:<NAME>=required|forbidden` extra specs: a host has a trait when its extra
/// capability `<NAME>` is `true` (any case). Returns (name, required).
pub(crate) fn flavor_traits(flavor: &FlavorRow) -> ServiceResult<Vec<(String, bool)>> {
    let mut traits = Vec::new();
    for (key, value) in &flavor.extra_specs {
        let Some(name) = key.strip_prefix("trait:") else {
            continue;
        };
        let required = match value.as_str() {
            Some("required") => true,
            Some("forbidden") => false,
            _ => {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter {key}: a trait is \"required\" or \"forbidden\", got {value}"
                )));
            }
        };
        traits.push((name.to_string(), required));
    }
    Ok(traits)
}

/// The `trait:` requirements of a flavor the cloud gave, checked as a registered one's are
/// (its size too: a flavor that asks for nothing is refused before the cloud is asked more).
pub(crate) fn cloud_flavor_traits(flavor: &Value) -> ServiceResult<Vec<(String, bool)>> {
    let row = flavor_row_from_json(flavor).ok_or_else(|| {
        ServiceError::Unavailable(format!("the cloud's flavor is malformed: {flavor}"))
    })?;
    flavor_size(&row)?;
    flavor_traits(&row)
}

fn has_trait(host: &HostRecord, name: &str) -> bool {
    host.capabilities
        .get(name)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

fn flavor_json(flavor: &FlavorRow) -> Value {
    json!({
        "id": flavor.id,
        "name": flavor.name,
        "vcpus": flavor.vcpus,
        "ram": flavor.ram,
        "disk": flavor.disk,
        "OS-FLV-EXT-DATA:ephemeral": flavor.ephemeral,
        "extra_specs": flavor.extra_specs,
    })
}

impl FlavorInstanceType {
    /// The source flavor stored in `resource_properties` (as Blazar stores it).
    fn stored_flavor(params: &Map<String, Value>) -> Option<Value> {
        params
            .get("resource_properties")
            .and_then(Value::as_str)
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
    }

    fn shape(params: &Map<String, Value>) -> ServiceResult<Shape> {
        let flavor = Self::stored_flavor(params)
            .and_then(|f| flavor_row_from_json(&f))
            .ok_or_else(|| {
                ServiceError::Internal("flavor:instance reservation without its flavor".into())
            })?;
        Ok(Shape {
            slot: flavor_size(&flavor)?,
            amount: int_field(params, "amount")?,
            affinity: Affinity::parse(params.get("affinity"))?,
            queries: Vec::new(),
            traits: flavor_traits(&flavor)?,
            trait_hosts: None,
            key: String::new(),
        })
    }

    /// The shape with what the cloud last said of its traits.
    fn shape_now(&self, params: &Map<String, Value>) -> ServiceResult<Shape> {
        let mut shape = Self::shape(params)?;
        shape.trait_hosts = self.trait_hosts.hosts(&shape.traits);
        Ok(shape)
    }
}

fn flavor_row_from_json(v: &Value) -> Option<FlavorRow> {
    Some(FlavorRow {
        id: v.get("id")?.as_str()?.to_string(),
        name: v.get("name")?.as_str()?.to_string(),
        vcpus: v.get("vcpus")?.as_i64()?,
        ram: v.get("ram")?.as_i64()?,
        disk: v.get("disk")?.as_i64()?,
        ephemeral: v
            .get("OS-FLV-EXT-DATA:ephemeral")
            .and_then(Value::as_i64)
            .unwrap_or(0),
        extra_specs: v
            .get("extra_specs")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        created_at: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
        updated_at: None,
    })
}

#[async_trait]
impl ResourceType for FlavorInstanceType {
    fn name(&self) -> &'static str {
        FLAVOR_INSTANCE
    }

    fn kind(&self) -> &'static str {
        PHYSICAL_HOST
    }

    fn validate(
        &self,
        request: &Map<String, Value>,
        current: Option<&Map<String, Value>>,
    ) -> ServiceResult<Map<String, Value>> {
        check_fields(request, FLAVOR_FIELDS, FLAVOR_INSTANCE)?;
        let mut out = current.cloned().unwrap_or_default();
        match request.get("flavor_id") {
            Some(Value::String(f)) if !f.trim().is_empty() => {
                // Resolved against the registered flavors in `resolve`.
                out.insert("requested_flavor".into(), Value::from(f.clone()));
            }
            None if current.is_some() => {}
            None | Some(Value::Null) | Some(Value::String(_)) => {
                return Err(ServiceError::BadRequest(
                    "Missing parameter flavor_id".into(),
                ));
            }
            Some(other) => {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter flavor_id: expected a flavor id or name, got {other}"
                )));
            }
        }
        if let Some(amount) = request.get("amount") {
            out.insert("amount".into(), amount.clone());
        }
        out.insert("amount".into(), Value::from(int_field(&out, "amount")?));
        let affinity = match request.get("affinity") {
            Some(v) => Affinity::parse(Some(v))?,
            None => Affinity::parse(out.get("affinity"))?,
        };
        out.insert("affinity".into(), affinity.to_value());
        Ok(out)
    }

    async fn resolve(
        &self,
        tx: &mut Tx,
        mut params: Map<String, Value>,
    ) -> ServiceResult<Map<String, Value>> {
        let flavor = if let Some(cloud) = params.remove(CLOUD_FLAVOR) {
            params.remove("requested_flavor");
            flavor_row_from_json(&cloud).ok_or_else(|| {
                ServiceError::Unavailable(format!("the cloud's flavor is malformed: {cloud}"))
            })?
        } else {
            let Some(requested) = params.remove("requested_flavor") else {
                return Ok(params);
            };
            let requested = requested.as_str().unwrap_or_default().to_string();
            tx.find_flavor(&requested).await?.ok_or_else(|| {
                ServiceError::BadRequest(format!(
                    "Flavor {requested} not found: register it with POST /v1/flavors or use the \
                     id or name of a registered flavor"
                ))
            })?
        };
        let size = flavor_size(&flavor)?;
        flavor_traits(&flavor)?;
        let amount = params.get("amount").cloned().unwrap_or(Value::from(1));
        let affinity = params.get("affinity").cloned().unwrap_or(Value::Null);
        Ok(instance_fields(
            size,
            amount,
            affinity,
            flavor_json(&flavor).to_string(),
            Some(&params),
        ))
    }

    fn finish_params(&self, params: &mut Map<String, Value>, reservation_id: &str) {
        finish(params, reservation_id);
    }

    async fn allocate(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
    ) -> ServiceResult<Grant> {
        allocate_shape(
            tx,
            &self.shape_now(params)?,
            request,
            self.ratios,
            &self.cache,
            FLAVOR_INSTANCE,
        )
        .await
    }

    async fn refill(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
        missing: i64,
    ) -> ServiceResult<i64> {
        refill_shape(
            tx,
            &self.shape_now(params)?,
            request,
            self.ratios,
            &self.cache,
            missing,
        )
        .await
    }
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
    fn affinity_spellings() {
        let cases = [
            (json!(null), Affinity::Any),
            (json!("None"), Affinity::Any),
            (json!(true), Affinity::Same),
            (json!("True"), Affinity::Same),
            (json!("yes"), Affinity::Same),
            (json!(false), Affinity::Different),
            (json!("off"), Affinity::Different),
        ];
        for (value, expected) in cases {
            assert_eq!(Affinity::parse(Some(&value)).unwrap(), expected, "{value}");
        }
        assert!(Affinity::parse(Some(&json!("sometimes"))).is_err());
        assert!(Affinity::parse(Some(&json!(3))).is_err());
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
    }
}
