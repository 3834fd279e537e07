//! Reservation types over pools of whole resources besides hosts: floating IPs
//! (`virtual:floatingip`), network segments (`network`) and devices (`device`). Each unit is
//! granted exclusively, like a host.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use blazar_core::ResourceRecord;
use blazar_core::{PropertyQuery, ReservationSpec};
use blazar_db::Tx;
use serde_json::Value;

pub use blazar_core::reservation::{DEVICE, FLOATINGIP, NETWORK};

use crate::resources::{
    AllocationRequest, Grant, check_known_properties, grant_whole, pick_free, refill_whole,
};
use crate::{ServiceError, ServiceResult};

/// Fixed fields of each kind (a query may refer to them besides extra capabilities).
pub fn columns(kind: &str) -> &'static [&'static str] {
    match kind {
        FLOATINGIP => &[
            "id",
            "floating_network_id",
            "subnet_id",
            "floating_ip_address",
            "reservable",
        ],
        NETWORK => &[
            "id",
            "network_type",
            "physical_network",
            "segment_id",
            "reservable",
        ],
        DEVICE => &[
            "id",
            "name",
            "device_type",
            "device_driver",
            "vendor_id",
            "product_id",
            "reservable",
        ],
        _ => &[],
    }
}

/// The value a property query sees for `key` on a pool resource.
pub fn property<'a>(r: &'a ResourceRecord, key: &str) -> Option<Cow<'a, str>> {
    let r = &r.resource;
    match key {
        "id" => Some(Cow::Borrowed(r.uid.as_str())),
        "reservable" => Some(Cow::Borrowed(if r.reservable { "True" } else { "False" })),
        _ => match r.attrs.get(key) {
            Some(Value::String(s)) => Some(Cow::Borrowed(s.as_str())),
            Some(Value::Number(n)) => Some(Cow::Owned(n.to_string())),
            Some(Value::Bool(b)) => Some(Cow::Owned(b.to_string())),
            _ => r.capabilities.get(key).map(|v| Cow::Borrowed(v.as_str())),
        },
    }
}

/// The pool kind and its words for messages.
pub(crate) fn noun(kind: &str) -> &'static str {
    match kind {
        FLOATINGIP => "floating IP",
        NETWORK => "network segment",
        _ => "device",
    }
}

/// A floating IP's address, as its record holds it.
pub(crate) fn address_of(r: &ResourceRecord) -> Option<&str> {
    r.resource
        .attrs
        .get("floating_ip_address")
        .and_then(Value::as_str)
}

/// Blazar's refusal when units are short, without the reasons.
pub(crate) fn bare_refusal(kind: &str) -> String {
    format!("Not enough {}s available", noun(kind))
}

/// How many units a pool spec wants: `(min, max)`.
pub(crate) fn count(spec: &ReservationSpec) -> (u32, u32) {
    match spec {
        ReservationSpec::FloatingIp(f) => (f.amount, f.amount),
        ReservationSpec::Device(d) => (d.min, d.max),
        _ => (1, 1),
    }
}

/// Resources of the spec's pool that match it, in preference order, those it names
/// (`required_floatingips`, unless `loose`), and the first named one that is not among them.
pub(crate) async fn matching(
    tx: &mut Tx,
    spec: &ReservationSpec,
    loose: bool,
) -> ServiceResult<(Vec<i64>, Vec<i64>, Option<String>)> {
    let kind = spec.kind();
    // The version this choice is made from: a capability or `reservable` change committed
    // before the chosen resources are locked sends the transaction round again
    // (`resources::lock_reservable`) instead of granting on what was read before it.
    tx.inventory_version(kind).await?;
    let pool = tx.list_resources(kind).await?;
    let columns = columns(kind);
    let mut queries: Vec<&PropertyQuery> = Vec::new();
    for (field, query) in spec.queries() {
        let Some(q) = query.parsed() else { continue };
        if let Err(unknown) = check_known_properties(
            field,
            q,
            |k| columns.contains(&k),
            pool.iter().map(|r| &r.resource.capabilities),
            noun(kind),
        ) {
            return Err(unknown.into_error(tx, kind).await);
        }
        queries.push(q);
    }
    let (network, wanted): (Option<&str>, &[String]) = match spec {
        ReservationSpec::FloatingIp(f) if loose => (Some(f.network_id.as_str()), &[]),
        ReservationSpec::FloatingIp(f) => (Some(f.network_id.as_str()), &f.required_floatingips),
        _ => (None, &[]),
    };
    let matching: Vec<&ResourceRecord> = pool
        .iter()
        .filter(|r| r.resource.reservable)
        .filter(|r| {
            network.is_none_or(|n| {
                r.resource
                    .attrs
                    .get("floating_network_id")
                    .and_then(Value::as_str)
                    == Some(n)
            })
        })
        .filter(|r| {
            let lookup = |k: &str| property(r, k);
            queries.iter().all(|q| q.matches(&lookup))
        })
        .collect();
    let mut required = Vec::new();
    let mut missing = None;
    let by_address: HashMap<&str, i64> = if wanted.is_empty() {
        HashMap::new()
    } else {
        matching
            .iter()
            .filter_map(|r| Some((address_of(r)?, r.id)))
            .collect()
    };
    for address in wanted {
        match by_address.get(address.as_str()) {
            Some(id) => required.push(*id),
            None => {
                missing.get_or_insert_with(|| address.clone());
            }
        }
    }
    Ok((matching.iter().map(|r| r.id).collect(), required, missing))
}

/// Chooses whole units of the spec's pool for the window and writes their allocations.
pub(crate) async fn allocate(
    tx: &mut Tx,
    spec: &ReservationSpec,
    request: &AllocationRequest<'_>,
) -> ServiceResult<Grant> {
    let kind = spec.kind();
    // No allocation lock: `pick_free` claims what it picks (see there).
    let (min, max) = count(spec);
    let (matching, required, missing) = matching(tx, spec, false).await?;
    let busy = tx
        .busy_among(
            kind,
            &required,
            request.window.start(),
            request.blocked_until,
        )
        .await?;
    let required_busy = required.iter().filter(|id| busy.contains(id)).count();
    if missing.is_some() || required_busy > 0 {
        // The counts are of the required addresses: how many are reservable addresses of
        // the network, and how many of those are free.
        let counts = (required.len(), required.len() - required_busy);
        return Err(
            request.shortfall(kind, &bare_refusal(kind), counts, |_| match missing {
                Some(address) => format!(
                    "Not enough floating IPs available: the required floating IP {address} is \
                 not a reservable floating IP of network {}",
                    match spec {
                        ReservationSpec::FloatingIp(f) => f.network_id.as_str(),
                        _ => "",
                    }
                ),
                None => format!(
                    "Not enough floating IPs available for reservation {}: a required floating IP \
                 is already reserved in that window",
                    request.named
                ),
            }),
        );
    }
    let keep: Vec<i64> = required
        .iter()
        .chain(request.keep.iter())
        .copied()
        .collect();
    let chosen = pick_free(
        tx,
        kind,
        &matching,
        &keep,
        request,
        crate::resources::count(min),
        crate::resources::count(max),
    )
    .await?
    .map_err(|s| {
        request.shortfall(kind, &bare_refusal(kind), (s.matching, s.free), |window| {
            format!(
                "Not enough {}s available for reservation {} ({kind}, {min} wanted): {} match \
                 the request and are reservable, {} of them free {window}",
                noun(kind),
                request.named,
                s.matching,
                s.free,
            )
        })
    })?;
    // A required address claimed by a concurrent lease was waited for and found taken:
    // this round saw it free, the next one refuses with the reason.
    if required.iter().any(|id| !chosen.contains(id)) {
        return Err(ServiceError::Retry(format!(
            "a required {kind} resource was taken concurrently"
        )));
    }
    grant_whole(tx, kind, request, chosen).await
}

/// Healing of a pool reservation: up to `missing` more units. A required floating IP is
/// the address its user named and no other stands in for it: the required addresses the
/// reservation does not hold (one that failed, once it is back) are taken again first, and
/// only the rest of what is missing may be any other address of the network.
pub(crate) async fn refill(
    tx: &mut Tx,
    spec: &ReservationSpec,
    request: &AllocationRequest<'_>,
    missing: i64,
) -> ServiceResult<i64> {
    tx.lock_allocations().await?;
    let (matching, _, _) = matching(tx, spec, true).await?;
    let required: &[String] = match spec {
        ReservationSpec::FloatingIp(f) => &f.required_floatingips,
        _ => &[],
    };
    if required.is_empty() {
        return refill_whole(tx, spec.kind(), &matching, request, missing).await;
    }
    let kind = spec.kind();
    // One read for what it holds (maybe out of service) and what it may take.
    let mut ids: Vec<i64> = matching.iter().chain(request.keep).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    let records = tx.resources_named(kind, &ids).await?;
    let held: HashSet<&str> = records
        .iter()
        .filter(|r| request.keep.contains(&r.id))
        .filter_map(address_of)
        .collect();
    let unheld: Vec<&str> = required
        .iter()
        .map(String::as_str)
        .filter(|a| !held.contains(a))
        .collect();
    let candidates: HashSet<i64> = matching.into_iter().collect();
    let (mut named, mut others) = (Vec::new(), Vec::new());
    for r in records.iter().filter(|r| candidates.contains(&r.id)) {
        match address_of(r) {
            Some(a) if unheld.contains(&a) => named.push(r.id),
            Some(a) if required.iter().any(|q| q == a) => {}
            _ => others.push(r.id),
        }
    }
    let unheld = i64::try_from(unheld.len()).unwrap_or(i64::MAX);
    let again = refill_whole(tx, kind, &named, request, missing.min(unheld)).await?;
    let rest = (missing - unheld).max(0);
    let more = if rest > 0 {
        refill_whole(tx, kind, &others, request, rest).await?
    } else {
        0
    };
    Ok(again + more)
}
