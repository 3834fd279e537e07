//! Resource types: how a reservation request of one type is validated and how resources are
//! chosen for it. `physical:host` is the first; instances, floating IPs, network segments and
//! devices implement the same trait.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use blazar_core::host::HostRecord;
use blazar_core::{PHYSICAL_HOST, PropertyQuery, TimeWindow, engine};
use blazar_db::{Backend, NewAllocation, Tx};
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::{ServiceError, ServiceResult};

/// What an allocation is for.
#[derive(Debug, Clone)]
pub struct AllocationRequest<'a> {
    pub lease_id: &'a str,
    pub reservation_id: &'a str,
    /// 1-based position of the reservation in the lease, for error messages.
    pub ordinal: usize,
    pub window: TimeWindow,
    pub blocked_until: DateTime<Utc>,
    /// Resources the reservation holds already; kept when possible.
    pub keep: &'a [i64],
    /// Whether a refusal may say why (counts, which address is taken) or must be Blazar's
    /// bare message: the `blazar:leases:explain_refusal` rule, and never when a non-admin's
    /// query names a private property.
    pub explain: bool,
}

/// What an allocation granted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// The resources allocated (host ids for instance slots).
    pub resources: Vec<i64>,
    /// Units granted: hosts, devices, addresses, segments, or instance slots.
    pub units: i64,
}

#[async_trait]
pub trait ResourceType: Send + Sync {
    /// The `resource_type` string of the API.
    fn name(&self) -> &'static str;

    /// The inventory kind whose allocations this type writes (instance slots are allocations
    /// of hosts).
    fn kind(&self) -> &'static str;

    /// Checks that need the database (a named flavor exists, required addresses are
    /// registered) and completes the fields from it.
    async fn resolve(
        &self,
        _tx: &mut Tx,
        params: Map<String, Value>,
    ) -> ServiceResult<Map<String, Value>> {
        Ok(params)
    }

    /// Adds the fields known once the reservation has an id.
    fn finish_params(&self, _params: &mut Map<String, Value>, _reservation_id: &str) {}

    /// Validates a reservation request and returns the type-specific fields to store and show.
    /// For an update, `current` holds the stored fields and `request` only what changes.
    fn validate(
        &self,
        request: &Map<String, Value>,
        current: Option<&Map<String, Value>>,
    ) -> ServiceResult<Map<String, Value>>;

    /// Chooses resources for the window and writes the allocations, in the caller's
    /// transaction.
    async fn allocate(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
    ) -> ServiceResult<Grant>;

    /// Allocates `missing` more units over the window for a reservation that lost some
    /// (healing), avoiding what it holds. Returns the units added, which may be fewer.
    async fn refill(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
        missing: i64,
    ) -> ServiceResult<i64>;
}

/// How many candidates one query checks for availability.
const PROBE_BATCH: usize = 128;

/// Picks between `min` and `max` free resources of `kind` among `matching` (those in `keep`
/// first), checking availability batch by batch in preference order and stopping as soon as
/// `max` are free: on a large inventory most candidates are never looked at.
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
    if keep.is_empty() {
        order.extend_from_slice(matching);
    } else {
        let matching_set: HashSet<i64> = matching.iter().copied().collect();
        order.extend(keep.iter().copied().filter(|id| matching_set.contains(id)));
        let kept: HashSet<i64> = order.iter().copied().collect();
        order.extend(matching.iter().copied().filter(|id| !kept.contains(id)));
    }
    let mut busy = HashSet::new();
    let mut probed = 0;
    let mut free = 0;
    // A first batch sized to the request (most candidates are free at most times), then
    // larger ones while too few turn out free.
    let mut batch_size = (4 * max + 8).min(PROBE_BATCH);
    while probed < order.len() && free < max {
        let batch = &order[probed..(probed + batch_size).min(order.len())];
        let taken = tx
            .busy_among(kind, batch, request.window.start(), request.blocked_until)
            .await?;
        free += batch.iter().filter(|id| !taken.contains(id)).count();
        busy.extend(taken);
        probed += batch.len();
        batch_size = PROBE_BATCH;
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
    let rows: Vec<NewAllocation> = chosen
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
pub(crate) async fn lock_reservable(
    tx: &mut Tx,
    kind: &str,
    ids: &[i64],
) -> ServiceResult<Vec<i64>> {
    Ok(if kind == PHYSICAL_HOST {
        if tx.backend() == Backend::Sqlite && tx.is_writer() {
            // Host candidates come from the inventory version read in this transaction, and
            // a SQLite writer holds the database's only write lock from its first statement:
            // no host can have changed since.
            return Ok(ids.to_vec());
        }
        tx.lock_reservable_hosts(ids).await?
    } else {
        tx.lock_reservable_resources(ids).await?
    })
}

/// The host inventory as of one inventory version, with an index by id.
pub struct Inventory {
    pub hosts: Vec<HostRecord>,
    index: HashMap<i64, usize>,
}

impl Inventory {
    pub fn get(&self, id: i64) -> Option<&HostRecord> {
        self.index.get(&id).map(|i| &self.hosts[*i])
    }
}

struct Snapshot {
    version: i64,
    inventory: Arc<Inventory>,
    /// Matching host ids per query text: most requests repeat a few filters.
    matches: HashMap<String, Arc<Vec<i64>>>,
    /// What `matches` holds, in bytes (see `filter_weight`).
    matches_bytes: usize,
}

/// Most memory the remembered filters may take per inventory version. Bounded by bytes, not
/// entries: keys are request text, and a count bound let large distinct queries (each
/// refused, nothing stored) grow the server by a gigabyte.
pub(crate) const MAX_CACHED_FILTER_BYTES: usize = 16 * 1024 * 1024;

/// The memory one remembered filter takes: its key, its host ids, and the map's overhead.
fn filter_weight(key: &str, matching: &[i64]) -> usize {
    key.len() + std::mem::size_of_val(matching) + 64
}

impl Snapshot {
    /// Remembers a filter's matches within the byte budget. When it would overflow, the
    /// remembered filters are dropped at once (cheap, and the common ones come back first).
    fn remember(&mut self, key: &str, matching: &Arc<Vec<i64>>) {
        let weight = filter_weight(key, matching);
        if weight > MAX_CACHED_FILTER_BYTES / 4 {
            return;
        }
        if self.matches_bytes + weight > MAX_CACHED_FILTER_BYTES {
            self.matches.clear();
            self.matches_bytes = 0;
        }
        if let Some(old) = self.matches.insert(key.to_string(), matching.clone()) {
            self.matches_bytes -= filter_weight(key, &old);
        }
        self.matches_bytes += weight;
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
}

impl HostCache {
    /// The hosts matching `queries` (keyed by `key`, the query texts), and the inventory.
    pub async fn matching(
        &self,
        tx: &mut Tx,
        queries: &[(&str, &Option<PropertyQuery>)],
        key: &str,
    ) -> ServiceResult<(Arc<Inventory>, Arc<Vec<i64>>)> {
        let (version, inventory, cached) = self.snapshot(tx, Some(key)).await?;
        if let Some(matching) = cached {
            return Ok((inventory, matching));
        }
        let matching = match matching_hosts(&inventory.hosts, queries) {
            Ok(matching) => Arc::new(matching),
            Err(unknown) => return Err(unknown.into_error(tx, PHYSICAL_HOST).await),
        };
        if let Some(snapshot) = self.lock().as_mut().filter(|s| s.version == version) {
            snapshot.remember(key, &matching);
        }
        Ok((inventory, matching))
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
        let cached = self
            .lock()
            .as_ref()
            .filter(|s| s.version == version)
            .map(|s| {
                (
                    s.inventory.clone(),
                    key.and_then(|k| s.matches.get(k).cloned()),
                )
            });
        if let Some((inventory, matching)) = cached {
            return Ok((version, inventory, matching));
        }
        let hosts = tx.list_hosts().await?;
        let index = hosts.iter().enumerate().map(|(i, h)| (h.id, i)).collect();
        let inventory = Arc::new(Inventory { hosts, index });
        // A transaction that changed the hosts sees what may never commit: keep it to itself.
        if !tx.changed_inventory(PHYSICAL_HOST) {
            *self.lock() = Some(Snapshot {
                version,
                inventory: inventory.clone(),
                matches: HashMap::new(),
                matches_bytes: 0,
            });
        }
        Ok((version, inventory, None))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Snapshot>> {
        // A panic while holding the lock cannot leave the snapshot half-written (it is
        // replaced whole), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct PhysicalHostType {
    pub cache: Arc<HostCache>,
}

const HOST_FIELDS: &[&str] = &[
    "min",
    "max",
    "hypervisor_properties",
    "resource_properties",
    "before_end",
];
const BEFORE_END_ACTIONS: &[&str] = &["default", "", "snapshot"];

/// Refuses fields a reservation type does not know (besides `resource_type`, and `id` in an
/// update).
pub(crate) fn check_fields(
    request: &Map<String, Value>,
    fields: &[&str],
    kind: &str,
) -> ServiceResult<()> {
    let unknown: Vec<&str> = request
        .keys()
        .map(String::as_str)
        .filter(|k| !fields.contains(k) && *k != "resource_type" && *k != "id")
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(ServiceError::BadRequest(format!(
        "Unknown field(s) {} in a {kind} reservation; accepted fields: {}",
        unknown.join(", "),
        fields.join(", ")
    )))
}

/// The stored fields of a reservation (none for a create) with the request's changes on top.
pub(crate) fn merge_fields(
    request: &Map<String, Value>,
    current: Option<&Map<String, Value>>,
    fields: &[&str],
) -> Map<String, Value> {
    let mut merged = current.cloned().unwrap_or_default();
    for (k, v) in request {
        if fields.contains(&k.as_str()) {
            merged.insert(k.clone(), v.clone());
        }
    }
    merged
}

/// A count from 1 to 2^31-1: a JSON integer, or a string holding one (`"2"`, as Chameleon's
/// clients send and its fork accepts; Blazar meant to and answers 500). Callers store the
/// integer, so a string never reaches the database.
pub(crate) fn int_field(map: &Map<String, Value>, key: &str) -> ServiceResult<i64> {
    let out_of_range = |shown: &dyn std::fmt::Display| {
        ServiceError::BadRequest(format!(
            "Malformed parameter {key}: must be an integer from 1 to {}, got {shown}",
            i32::MAX
        ))
    };
    let in_range = |v: i64| (1..=i64::from(i32::MAX)).contains(&v);
    match map.get(key) {
        None | Some(Value::Null) => {
            Err(ServiceError::BadRequest(format!("Missing parameter {key}")))
        }
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) if in_range(v) => Ok(v),
            _ => Err(out_of_range(n)),
        },
        Some(Value::String(s)) if integer_like(s) => match s.trim().parse::<i64>() {
            Ok(v) if in_range(v) => Ok(v),
            _ => Err(out_of_range(&Value::from(s.as_str()))),
        },
        Some(other) => Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: must be a JSON integer of at least 1, got {other}"
        ))),
    }
}

/// Decimal digits with an optional sign, surrounded by optional blanks: what Python's `int()`
/// takes from a string (but for digit-group underscores).
fn integer_like(text: &str) -> bool {
    let t = text.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Longest property query taken (`hypervisor_properties`, `resource_properties`): real
/// queries are a few hundred bytes.
pub const MAX_QUERY_BYTES: usize = 64 * 1024;

pub(crate) fn query_field(
    map: &Map<String, Value>,
    key: &str,
) -> ServiceResult<(String, Option<PropertyQuery>)> {
    let text = match map.get(key) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        // Blazar stores the query as a JSON string; a list sent as JSON means the same thing.
        Some(list @ Value::Array(_)) => list.to_string(),
        Some(other) => {
            return Err(ServiceError::BadRequest(format!(
                "Malformed requirements {key}: expected a query string such as \
                 '[\"==\", \"$gpu\", \"true\"]', got {other}"
            )));
        }
    };
    if text.len() > MAX_QUERY_BYTES {
        return Err(ServiceError::BadRequest(format!(
            "Malformed requirements {key}: the query is {} bytes long; the limit is {MAX_QUERY_BYTES}",
            text.len()
        )));
    }
    let query = PropertyQuery::parse(&text).map_err(|e| {
        ServiceError::BadRequest(format!("Malformed requirements {key} {text}: {e}"))
    })?;
    Ok((text, query))
}

/// Blazar's refusal when hosts (or instance slots) are short, without the reasons.
pub(crate) const NOT_ENOUGH_HOSTS: &str = "Not enough hosts available";

/// The property names a reservation's queries use.
pub(crate) fn query_keys(params: &Map<String, Value>) -> ServiceResult<Vec<String>> {
    let mut keys = Vec::new();
    for field in [
        "hypervisor_properties",
        "resource_properties",
        "network_properties",
    ] {
        if let (_, Some(query)) = query_field(params, field)? {
            keys.extend(query.keys().into_iter().map(str::to_string));
        }
    }
    Ok(keys)
}

/// A query on a property no resource of the kind has (Blazar answers those with a 500).
#[derive(Debug)]
pub(crate) struct UnknownProperty {
    field: String,
    key: String,
    noun: &'static str,
    /// Every capability name the resources have, private ones included.
    known: Vec<String>,
}

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
        let known = if shown.is_empty() {
            format!("no {} has public extra capabilities", self.noun)
        } else {
            format!("known extra capabilities: {}", shown.join(", "))
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

/// Hosts that are reservable and match both property queries, in id order.
/// The cache key of a host reservation's filters.
fn host_filter_key(params: &Map<String, Value>) -> String {
    let text = |k: &str| params.get(k).map(Value::to_string).unwrap_or_default();
    format!(
        "{}\u{1}{}",
        text("hypervisor_properties"),
        text("resource_properties")
    )
}

pub(crate) fn matching_hosts(
    hosts: &[HostRecord],
    queries: &[(&str, &Option<PropertyQuery>)],
) -> Result<Vec<i64>, UnknownProperty> {
    for (field, query) in queries {
        if let Some(q) = query {
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
                .all(|(_, q)| q.as_ref().is_none_or(|q| q.matches(&lookup)))
        })
        .map(|h| h.id)
        .collect())
}

#[async_trait]
impl ResourceType for PhysicalHostType {
    fn name(&self) -> &'static str {
        PHYSICAL_HOST
    }

    fn kind(&self) -> &'static str {
        PHYSICAL_HOST
    }

    fn validate(
        &self,
        request: &Map<String, Value>,
        current: Option<&Map<String, Value>>,
    ) -> ServiceResult<Map<String, Value>> {
        check_fields(request, HOST_FIELDS, PHYSICAL_HOST)?;
        let merged = merge_fields(request, current, HOST_FIELDS);
        let min = int_field(&merged, "min")?;
        let max = int_field(&merged, "max")?;
        if max < min {
            return Err(ServiceError::BadRequest(format!(
                "Invalid values for min/max of hosts. Max must be equal to or larger than min \
                 (got min {min}, max {max})"
            )));
        }
        let (hypervisor_properties, _) = query_field(&merged, "hypervisor_properties")?;
        let (resource_properties, _) = query_field(&merged, "resource_properties")?;
        let before_end = match merged.get("before_end") {
            None | Some(Value::Null) => "default".to_string(),
            Some(Value::String(s)) if BEFORE_END_ACTIONS.contains(&s.as_str()) => s.clone(),
            Some(other) => {
                return Err(ServiceError::BadRequest(format!(
                    "Malformed parameter before_end: use one of \"default\", \"\", \"snapshot\", got {other}"
                )));
            }
        };
        // Blazar's key order, which clients print as they receive it.
        let mut out = Map::new();
        out.insert(
            "hypervisor_properties".into(),
            Value::from(hypervisor_properties),
        );
        out.insert(
            "resource_properties".into(),
            Value::from(resource_properties),
        );
        out.insert("before_end".into(), Value::from(before_end));
        out.insert("min".into(), Value::from(min));
        out.insert("max".into(), Value::from(max));
        Ok(out)
    }

    async fn allocate(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
    ) -> ServiceResult<Grant> {
        let min = int_field(params, "min")? as usize;
        let max = int_field(params, "max")? as usize;
        let (_, hypervisor_query) = query_field(params, "hypervisor_properties")?;
        let (_, resource_query) = query_field(params, "resource_properties")?;

        tx.lock_allocations().await?;
        let (_, matching) = self
            .cache
            .matching(
                tx,
                &[
                    ("hypervisor_properties", &hypervisor_query),
                    ("resource_properties", &resource_query),
                ],
                &host_filter_key(params),
            )
            .await?;
        let chosen = pick_free(
            tx,
            PHYSICAL_HOST,
            &matching,
            request.keep,
            request,
            min,
            max,
        )
        .await?
        .map_err(|s| {
            if !request.explain {
                return ServiceError::Conflict(NOT_ENOUGH_HOSTS.into());
            }
            ServiceError::Conflict(format!(
                "Not enough hosts available for reservation {} (physical:host, min {}): {} host(s) \
                 match the filters and are reservable, {} of them free from {} to {}",
                request.ordinal,
                s.min,
                s.matching,
                s.free,
                request.window.start().format("%Y-%m-%d %H:%M"),
                request.window.end().format("%Y-%m-%d %H:%M"),
            ))
        })?;
        grant_whole(tx, PHYSICAL_HOST, request, chosen).await
    }

    async fn refill(
        &self,
        tx: &mut Tx,
        params: &Map<String, Value>,
        request: &AllocationRequest<'_>,
        missing: i64,
    ) -> ServiceResult<i64> {
        let (_, hypervisor_query) = query_field(params, "hypervisor_properties")?;
        let (_, resource_query) = query_field(params, "resource_properties")?;
        tx.lock_allocations().await?;
        let (_, matching) = self
            .cache
            .matching(
                tx,
                &[
                    ("hypervisor_properties", &hypervisor_query),
                    ("resource_properties", &resource_query),
                ],
                &host_filter_key(params),
            )
            .await?;
        refill_whole(tx, PHYSICAL_HOST, &matching, request, missing).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn validate(v: Value) -> Result<Map<String, Value>, ServiceError> {
        let Value::Object(map) = v else {
            panic!("object")
        };
        PhysicalHostType {
            cache: Default::default(),
        }
        .validate(&map, None)
    }

    #[test]
    fn validation_table() {
        let ok = [
            json!({"min": 1, "max": 2, "hypervisor_properties": "", "resource_properties": ""}),
            json!({"min": 1, "max": 1}),
            json!({"min": 2, "max": 2, "resource_properties": "[\"==\", \"$gpu\", \"true\"]", "before_end": "snapshot"}),
            json!({"min": 1, "max": 1, "resource_properties": ["or", ["==", "$a", "1"], ["==", "$a", "2"]]}),
            json!({"min": "1", "max": " 2 "}),
            json!({"min": "+1", "max": "2147483647"}),
        ];
        for v in ok {
            assert!(validate(v.clone()).is_ok(), "{v}");
        }
        // Integer-like strings are stored as integers.
        let stored = validate(json!({"min": "1", "max": "02"})).unwrap();
        assert_eq!((&stored["min"], &stored["max"]), (&json!(1), &json!(2)));
        let bad = [
            (json!({"max": 1}), "Missing parameter min"),
            (json!({"min": "1.5", "max": 1}), "Malformed parameter min"),
            (json!({"min": "one", "max": 1}), "Malformed parameter min"),
            (json!({"min": "0", "max": 1}), "Malformed parameter min"),
            (json!({"min": "-1", "max": 1}), "Malformed parameter min"),
            (
                json!({"min": "2147483648", "max": 1}),
                "Malformed parameter min",
            ),
            (
                json!({"min": "99999999999999999999", "max": 1}),
                "Malformed parameter min",
            ),
            (json!({"min": "1e3", "max": 1}), "Malformed parameter min"),
            (json!({"min": 1, "max": "0x10"}), "Malformed parameter max"),
            (json!({"min": "", "max": ""}), "Malformed parameter min"),
            (json!({"min": 0, "max": 1}), "Malformed parameter min"),
            (json!({"min": 1.5, "max": 2}), "Malformed parameter min"),
            (
                json!({"min": 3, "max": 2}),
                "Max must be equal to or larger than min",
            ),
            (
                json!({"min": 1, "max": 1, "resource_properties": "[\"==\", \"gpu\"]"}),
                "Malformed requirements",
            ),
            (
                json!({"min": 1, "max": 1, "before_end": "explode"}),
                "Malformed parameter before_end",
            ),
            (
                json!({"min": 1, "max": 1, "amount": 3}),
                "Unknown field(s) amount",
            ),
        ];
        for (v, expected) in bad {
            let err = validate(v.clone()).unwrap_err();
            assert!(
                matches!(err, ServiceError::BadRequest(ref m) if m.contains(expected)),
                "{v}: {err:?}"
            );
        }
    }

    #[test]
    fn remembered_filters_stay_within_their_byte_budget() {
        let mut snapshot = Snapshot {
            version: 1,
            inventory: Arc::new(Inventory {
                hosts: Vec::new(),
                index: HashMap::new(),
            }),
            matches: HashMap::new(),
            matches_bytes: 0,
        };
        let ids = Arc::new((0..1_000).collect::<Vec<i64>>());
        for i in 0..2_000 {
            // Distinct keys of 64 kB each, the largest query taken.
            let key = format!("{i}{}", "x".repeat(65_530));
            snapshot.remember(&key, &ids);
            let held: usize = snapshot
                .matches
                .iter()
                .map(|(k, v)| filter_weight(k, v))
                .sum();
            assert_eq!(held, snapshot.matches_bytes);
            assert!(held <= MAX_CACHED_FILTER_BYTES, "{held} bytes after {i}");
        }
        assert!(!snapshot.matches.is_empty());
        // Remembering a key again replaces it without counting it twice.
        let before = snapshot.matches_bytes;
        let key = snapshot.matches.keys().next().cloned().unwrap();
        snapshot.remember(&key, &ids);
        assert_eq!(snapshot.matches_bytes, before);
    }

    #[test]
    fn update_merges_with_stored_fields() {
        let stored = validate(
            json!({"min": 1, "max": 2, "resource_properties": "[\"==\", \"$gpu\", \"true\"]"}),
        )
        .unwrap();
        let change = json!({"max": 1});
        let Value::Object(change) = change else {
            unreachable!()
        };
        let merged = PhysicalHostType {
            cache: Default::default(),
        }
        .validate(&change, Some(&stored))
        .unwrap();
        assert_eq!(merged["max"], json!(1));
        assert_eq!(
            merged["resource_properties"],
            json!("[\"==\", \"$gpu\", \"true\"]")
        );
    }
}
