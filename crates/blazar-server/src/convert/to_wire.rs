//! Domain to wire: stored records and use-case answers become `blazar-api` response types.

use std::collections::BTreeMap;

use blazar_api::dates::{format_space, format_t};
use blazar_api::{
    Action, Allocation, AllocationReservation, Event, Flavor, Handover, Health, Host, Lease, Link,
    Notification, PoolResource, PropertyDetail, PropertyListing, PropertyName, ReconcileReport,
    Reservation, ReservationAllocation, ResourceProperty, Version,
};
use blazar_api::{InstanceSize, SlotUse, TimelineInterval, TimelinePeriod, TimelineResource};
use blazar_core::{ActionRecord, Property, ResourceRecord, SequencedNotification};
use blazar_core::{HostRecord, LeaseView};
use blazar_service::{AllocationEntry, AllocationView, GrantRow, Reason, ReservationRef};
use serde_json::{Map, Value};

pub fn host(h: HostRecord) -> Host {
    let capabilities: BTreeMap<String, Value> = h
        .capabilities
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    Host {
        id: h.id.to_string(),
        facts: h.facts,
        status: h.status,
        reservable: h.reservable,
        trust_id: h.trust_id,
        created_at: format_space(h.created_at),
        updated_at: h.updated_at.map(format_space),
        capabilities,
    }
}

/// One reason of a refused create or update. The window and the offer go with the counts:
/// all or none.
pub fn reason(r: &Reason) -> blazar_api::RefusalReason {
    let availability = r.availability.as_ref();
    blazar_api::RefusalReason {
        reservation: r.reservation.as_ref().map(|at| match at {
            ReservationRef::Position(n) => {
                blazar_api::ReservationRef::Position(u64::try_from(*n).unwrap_or(u64::MAX))
            }
            ReservationRef::Id(id) => blazar_api::ReservationRef::Id(id.clone()),
        }),
        resource_type: r.resource_type.clone(),
        requested: r.requested.as_ref().map(|q| blazar_api::Requested {
            min: q.min,
            max: q.max,
            amount: q.amount,
            vcpus: q.vcpus,
            memory_mb: q.memory_mb,
            disk_gb: q.disk_gb,
            affinity: q.affinity.map(str::to_string),
            flavor: q.flavor.clone(),
            network_id: q.network_id.clone(),
            required_floatingips: q.required_floatingips.clone(),
        }),
        matching: availability.map(|a| a.matching),
        free: availability.map(|a| a.free),
        start_date: availability.map(|a| format_t(a.window.start())),
        end_date: availability.map(|a| format_t(a.window.end())),
        next_offer: availability.map(|a| {
            a.next_offer.map(|w| blazar_api::OfferWindow {
                start_date: format_t(w.start()),
                end_date: format_t(w.end()),
            })
        }),
        rule: r.rule.clone(),
        field: r.field.clone(),
        filter: r.filter.clone(),
        quota: r.quota.as_ref().map(|q| blazar_api::QuotaRefusal {
            name: q.kind.as_str().to_string(),
            limit: q.limit,
            in_use: number(q.in_use),
            requested: number(q.requested),
            at: q.at.map(format_t),
            month: q.month.map(|m| m.start().format("%Y-%m").to_string()),
        }),
    }
}

/// A count or a weighted sum: whole numbers as integers, others with two decimals.
fn number(v: f64) -> serde_json::Number {
    let rounded = (v * 100.0).round() / 100.0;
    if rounded.fract() == 0.0 && rounded.abs() < 9.0e15 {
        serde_json::Number::from(rounded as i64)
    } else {
        serde_json::Number::from_f64(rounded).unwrap_or_else(|| serde_json::Number::from(0))
    }
}

/// A project's quotas: limits in force, its overrides, what it holds now.
pub fn ical_feed(feed: blazar_core::IcalFeed, path: Option<String>) -> blazar_api::IcalFeed {
    blazar_api::IcalFeed {
        id: feed.id,
        project_id: feed.project_id,
        description: feed.description,
        created_by: feed.created_by,
        created_at: format_space(feed.created_at),
        path,
    }
}

pub fn webhook(w: blazar_core::Webhook, with_secret: bool) -> blazar_api::Webhook {
    blazar_api::Webhook {
        id: w.id,
        project_id: w.project_id,
        url: w.url,
        event_types: w.event_types,
        description: w.description,
        created_by: w.created_by,
        created_at: format_space(w.created_at),
        secret: with_secret.then_some(w.secret),
    }
}

pub fn webhook_delivery(d: blazar_core::WebhookDelivery) -> blazar_api::WebhookDelivery {
    let pending = d.status == "pending";
    blazar_api::WebhookDelivery {
        id: d.notification_id,
        webhook_id: d.webhook_id,
        event_type: d.event_type,
        lease_id: d.lease_id,
        status: d.status,
        sending: d.sending,
        attempts: d.attempts,
        next_attempt_at: pending.then(|| format_space(d.next_attempt_at)),
        last_attempt_at: d.last_attempt_at.map(format_space),
        last_result: d.last_result,
        created_at: format_space(d.created_at),
    }
}

pub fn quota(q: blazar_service::ProjectQuota) -> blazar_api::Quota {
    use blazar_core::quota::QuotaKind;
    let limit = |kind| q.limits.get(kind).unwrap_or(-1);
    let whole = |v: f64| v.round() as i64;
    blazar_api::Quota {
        project_id: q.project_id.clone(),
        hosts: limit(QuotaKind::Hosts),
        floatingips: limit(QuotaKind::FloatingIps),
        instances: limit(QuotaKind::Instances),
        max_lease_duration: limit(QuotaKind::LeaseDuration),
        max_start_ahead: limit(QuotaKind::StartAhead),
        host_hours_per_month: limit(QuotaKind::HostHoursPerMonth),
        overrides: QuotaKind::ALL
            .iter()
            .filter_map(|k| q.overrides.get(*k).map(|v| (k.as_str().to_string(), v)))
            .collect(),
        usage: blazar_api::QuotaUsage {
            at: format_t(q.usage.at),
            hosts: whole(q.usage.hosts),
            floatingips: whole(q.usage.floatingips),
            instances: whole(q.usage.instances),
            month: q
                .usage
                .month
                .map(|m| m.start().format("%Y-%m").to_string())
                .unwrap_or_default(),
            host_hours: number(q.usage.host_hours),
        },
    }
}

fn reservation(r: blazar_core::Reservation) -> Reservation {
    Reservation {
        resource_type: r.resource_type().to_string(),
        id: r.id,
        lease_id: r.lease_id,
        resource_id: r.resource_id,
        status: r.status.to_string(),
        missing_resources: r.missing_resources,
        resources_changed: r.resources_changed,
        created_at: format_space(r.created_at),
        updated_at: r.updated_at.map(format_space),
        params: r.spec.fields(),
        allocations: None,
    }
}

fn event(e: blazar_core::Event) -> Event {
    Event {
        id: e.id,
        lease_id: e.lease_id,
        event_type: e.event_type.to_string(),
        time: format_t(e.time),
        status: e.status.to_string(),
        created_at: format_space(e.created_at),
        updated_at: e.updated_at.map(format_space),
    }
}

pub fn lease(v: LeaseView) -> Lease {
    let l = v.lease;
    Lease {
        id: l.id,
        name: l.name,
        user_id: l.user_id,
        project_id: l.project_id,
        trust_id: l.trust_id,
        start_date: format_t(l.start),
        end_date: format_t(l.end),
        status: l.status.to_string(),
        degraded: l.degraded,
        created_at: format_space(l.created_at),
        updated_at: l.updated_at.map(format_space),
        reservations: v.reservations.into_iter().map(reservation).collect(),
        events: v.events.into_iter().map(event).collect(),
    }
}

/// A lease with, in each reservation, what it holds (`?allocations=true`) or would hold (a
/// dry run); a reservation in `withheld` is shown without (`allocations` left out, not
/// empty: it is granted, the caller is not told what).
pub fn lease_with_grants(
    v: LeaseView,
    grants: &[GrantRow],
    withheld: &std::collections::HashSet<String>,
) -> Lease {
    let mut lease = lease(v);
    for reservation in &mut lease.reservations {
        if withheld.contains(&reservation.id) {
            continue;
        }
        reservation.allocations = Some(
            grants
                .iter()
                .filter(|g| g.reservation_id == reservation.id)
                .map(|g| ReservationAllocation {
                    resource_type: g.resource_type.clone(),
                    resource_id: g.resource_id.clone(),
                    start_date: format_t(g.start),
                    end_date: format_t(g.end),
                    units: g.units,
                })
                .collect(),
        );
    }
    lease
}

pub fn allocation(a: AllocationEntry) -> Allocation {
    Allocation {
        resource_id: a.resource_id,
        reservations: a.reservations.iter().map(allocation_reservation).collect(),
    }
}

/// One reservation holding a resource, as an allocation entry lists it.
pub fn allocation_reservation(r: &AllocationView) -> AllocationReservation {
    AllocationReservation {
        id: r.reservation_id.to_string(),
        lease_id: r.lease_id.to_string(),
        start_date: format_t(r.lease_start),
        end_date: format_t(r.lease_end),
    }
}

pub fn resource_property(p: Property) -> ResourceProperty {
    ResourceProperty {
        id: p.id,
        resource_type: p.resource_type,
        property_name: p.property_name,
        private: p.private,
        is_unique: p.is_unique,
        created_at: format_t(p.created_at),
        updated_at: p.updated_at.map(format_t),
    }
}

pub fn handover(listed: blazar_core::ListedHandover) -> Handover {
    let h = listed.handover;
    Handover {
        resource_type: h.resource_type,
        resource_id: listed.api_id,
        project_id: h.project_id,
        lease_id: h.lease_id,
        reservation_id: h.reservation_id,
        since: format_t(h.started_at),
        until: h.ended_at.map(format_t),
    }
}

/// An outside-world action, as `GET /v1/leases/{id}/actions` shows it.
pub fn action(row: &ActionRecord) -> Action {
    let intent = &row.intent;
    let payload: Value = serde_json::from_str(&intent.payload).unwrap_or(Value::Null);
    Action {
        seq: row.seq,
        lease_id: intent.lease_id.clone(),
        reservation_id: intent.reservation_id.clone(),
        project_id: intent.project_id.clone(),
        kind: intent.kind.to_string(),
        purpose: intent.purpose.to_string(),
        resource_type: intent.resource_type.clone(),
        resources: payload["resources"].clone(),
        status: row.status.to_string(),
        attempts: row.attempts,
        lost_attempts: row.lost_attempts,
        first_tried_at: row.first_tried_at.map(format_t),
        last_error: row.last_error.clone(),
        request_id: intent.request_id.clone(),
        not_before: format_t(row.not_before),
        created_at: format_t(row.created_at),
        updated_at: row.updated_at.map(format_t),
    }
}

/// A floating IP, network segment or device. `raw_times` selects the `T` format Blazar uses
/// for objects it returns straight from a write (a floating IP create).
pub fn pool_resource(record: ResourceRecord, raw_times: bool) -> PoolResource {
    let r = record.resource;
    let time = |t| {
        if raw_times {
            format_t(t)
        } else {
            format_space(t)
        }
    };
    let own = |k: &str| matches!(k, "id" | "reservable" | "created_at" | "updated_at");
    let fields: Map<String, Value> = r.attrs.into_iter().filter(|(k, _)| !own(k)).collect();
    // A capability never hides a key of the object itself.
    let capabilities = r
        .capabilities
        .into_iter()
        .filter(|(k, _)| !own(k) && !fields.contains_key(k))
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    PoolResource {
        id: r.uid,
        fields,
        reservable: r.reservable,
        created_at: time(record.created_at),
        updated_at: record.updated_at.map(time),
        capabilities,
    }
}

/// The `resource_properties` list: names, or names with values in detail mode.
pub fn property_listing(listing: blazar_service::PropertyListing) -> PropertyListing {
    match listing {
        blazar_service::PropertyListing::Names(names) => PropertyListing::Names(
            names
                .into_iter()
                .map(|property| PropertyName { property })
                .collect(),
        ),
        blazar_service::PropertyListing::Detail(details) => PropertyListing::Detail(
            details
                .into_iter()
                .map(|p| PropertyDetail {
                    property: p.property_name,
                    private: p.private,
                    values: p.values,
                    is_unique: p.is_unique,
                })
                .collect(),
        ),
    }
}

pub fn flavor(f: blazar_core::Flavor) -> Flavor {
    let s = f.source;
    Flavor {
        id: s.id,
        name: s.name,
        vcpus: s.vcpus,
        ram: s.ram,
        disk: s.disk,
        ephemeral: s.ephemeral,
        extra_specs: s.extra_specs,
        created_at: format_space(f.created_at),
        updated_at: f.updated_at.map(format_space),
    }
}

pub fn notification(n: blazar_core::Notification) -> Notification {
    Notification {
        id: n.id,
        event_type: n.event_type,
        lease_id: n.lease_id,
        payload: n.payload,
        created_at: format_t(n.created_at),
    }
}

pub fn reconcile_report(r: blazar_service::ReconcileReport) -> ReconcileReport {
    ReconcileReport {
        applied: r.applied,
        repairs: r.repairs,
        failed: r.failed,
    }
}

/// The one API version, as the version document lists it; `host` is the address the caller
/// used.
pub fn version(host: &str) -> Version {
    Version {
        id: "v1.0".into(),
        status: "CURRENT".into(),
        links: vec![Link {
            href: format!("http://{host}/v1"),
            rel: "self".into(),
        }],
        min_version: "1.0".into(),
        max_version: "1.0".into(),
    }
}

/// One event of the lease event stream.
pub fn lease_event(event: SequencedNotification) -> blazar_api::LeaseEvent {
    let n = event.notification;
    let text = |key: &str| n.payload_text(key).map(String::from);
    blazar_api::LeaseEvent {
        seq: event.seq,
        project_id: text("project_id"),
        status: text("status"),
        event_type: n.event_type,
        lease_id: n.lease_id,
        created_at: format_t(n.created_at),
    }
}

pub fn health(status: &str) -> Health {
    Health {
        status: status.to_string(),
    }
}

/// `POST /v1/leases/offers`.
pub fn offers(offers: Vec<blazar_service::LeaseOffer>) -> blazar_api::Offers {
    let is_instance = |kind: &str| kind == "virtual:instance" || kind == "flavor:instance";
    blazar_api::Offers {
        offers: offers
            .into_iter()
            .map(|o| blazar_api::Offer {
                start_date: format_t(o.window.start()),
                end_date: format_t(o.window.end()),
                duration: (o.window.end() - o.window.start()).num_minutes(),
                reservations: o
                    .reservations
                    .into_iter()
                    .map(|r| blazar_api::OfferedReservation {
                        resource_type: r.resource_type.to_string(),
                        amount: r.amount,
                        resources: r
                            .resources
                            .into_iter()
                            .map(|x| blazar_api::OfferedResource {
                                id: x.id,
                                name: x.name,
                                slots: is_instance(r.resource_type).then_some(x.units),
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// `GET /v1/leases/{id}/extension`.
pub fn extension(e: blazar_service::Extension) -> blazar_api::Extension {
    blazar_api::Extension {
        lease_id: e.lease_id,
        end_date: format_t(e.end),
        requested_end_date: e.requested_end.map(format_t),
        possible: e.possible,
        reason: e.refusal,
        keeps_resources: e.keeps_resources,
        latest_end_date: e.latest_end.map(format_t),
        searched_until: format_t(e.horizon),
    }
}

/// One resource of a timeline over `[start_date, end_date)` (formatted): a non-reservable
/// resource gets one period covering the window, so a calendar shades it without knowing
/// the rule.
pub fn timeline_resource(
    r: blazar_core::ResourceTimeline,
    start_date: &str,
    end_date: &str,
) -> TimelineResource {
    TimelineResource {
        id: r.id,
        name: r.name,
        reservable: r.reservable,
        non_reservable: if r.reservable {
            Vec::new()
        } else {
            vec![TimelinePeriod {
                start_date: start_date.to_string(),
                end_date: end_date.to_string(),
            }]
        },
        instance_capacity: r.instance_capacity.map(|c| InstanceSize {
            vcpus: c.vcpus,
            memory_mb: c.memory_mb,
            disk_gb: c.disk_gb,
        }),
        busy: r.busy.into_iter().map(timeline_interval).collect(),
    }
}

/// A timeline window's bounds as the wire writes them.
pub fn timeline_window(window: &blazar_core::TimeWindow) -> (String, String) {
    (format_t(window.start()), format_t(window.end()))
}

fn timeline_interval(b: blazar_core::BusyInterval) -> TimelineInterval {
    let (allocation, slots) = match b.holding {
        blazar_core::Holding::Whole => ("whole", None),
        blazar_core::Holding::Slots { units, size } => (
            "instances",
            Some(SlotUse {
                units,
                vcpus: size.vcpus,
                memory_mb: size.memory_mb,
                disk_gb: size.disk_gb,
            }),
        ),
    };
    let holder = b.holder;
    TimelineInterval {
        start_date: format_t(b.start),
        end_date: format_t(b.end),
        blocked_until: (b.blocked_until != b.end).then(|| format_t(b.blocked_until)),
        status: b.status.to_string(),
        degraded: b.degraded,
        own: b.own,
        lease_id: holder.as_ref().map(|h| h.lease_id.clone()),
        lease_name: holder.as_ref().map(|h| h.lease_name.clone()),
        project_id: holder.as_ref().map(|h| h.project_id.clone()),
        reservation_id: holder.map(|h| h.reservation_id),
        allocation: allocation.to_string(),
        slots,
    }
}
