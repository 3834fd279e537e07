//! Healing: when a resource goes out of service, every pending or active reservation holding
//! it for the future gets a replacement that matches its request; where none is free the
//! reservation is flagged `missing_resources` and its lease `degraded`. Reservations missing
//! resources are filled again when a resource comes back or a replacement frees up, and the
//! flags clear. Every change is recorded in the notification outbox.

use std::collections::HashSet;

use blazar_core::Notification;
use blazar_core::PHYSICAL_HOST;
use blazar_core::ReservationSpec;
use blazar_core::engine::{Usage, overflowing};
use blazar_core::time::truncate_to_minute;
use blazar_core::{ActionKind, ActionPurpose, LeaseStatus, ReservationStatus, TimeWindow};
use blazar_core::{Allocation, Lease, Reservation, ResourceRecord};
use blazar_db::Tx;
use chrono::{DateTime, Utc};
use serde_json::json;

use crate::refusal::ReservationRef;
use crate::resources::AllocationRequest;
use crate::{Service, ServiceError, ServiceResult};

fn is_live(r: &Reservation) -> bool {
    r.status == ReservationStatus::Pending || r.status == ReservationStatus::Active
}

/// Whether `reservation`'s resources are in the cloud, or on their way there (its lease
/// STARTING: the start's actions are open, carrying the resources they were recorded with).
/// A change to them is then carried out by actions, which run after the start's.
fn handed_over(lease: &Lease, reservation: &Reservation) -> bool {
    reservation.status == ReservationStatus::Active
        || (reservation.status == ReservationStatus::Pending
            && lease.status == LeaseStatus::Starting)
}

/// Whether `record` is one of the addresses `spec` requires by name.
fn is_required_address(spec: &ReservationSpec, record: Option<&ResourceRecord>) -> bool {
    let ReservationSpec::FloatingIp(f) = spec else {
        return false;
    };
    record
        .and_then(crate::pool::address_of)
        .is_some_and(|a| f.required_floatingips.iter().any(|r| r == a))
}

/// The reservation holding `allocation`, with its lease locked, while the reservation is
/// pending or active; `None` when it is over or gone (nothing to move).
async fn live_holder(
    tx: &mut Tx,
    allocation: &Allocation,
) -> ServiceResult<Option<(Reservation, Lease)>> {
    let Some(reservation) = tx.get_reservation(&allocation.reservation_id).await? else {
        return Ok(None);
    };
    if !is_live(&reservation) {
        return Ok(None);
    }
    Ok(tx
        .lock_lease(&reservation.lease_id)
        .await?
        .map(|lease| (reservation, lease)))
}

/// What [`Service::move_allocation`] does when no replacement is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreplaced {
    /// The allocation goes; the reservation is flagged as missing it.
    Flag,
    /// The allocation stays.
    Keep,
}

/// What [`Service::move_allocation`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    /// The reservation is over or gone: nothing to move.
    NotLive,
    /// The allocation left the resource (replaced, or flagged as missing).
    Away,
    /// Nothing was free to replace it: it stays ([`Unreplaced::Keep`]).
    Kept,
}

impl Service {
    async fn notify(
        &self,
        tx: &mut Tx,
        event_type: &str,
        lease: &Lease,
        reservation: &Reservation,
        detail: serde_json::Value,
        now: DateTime<Utc>,
    ) -> ServiceResult<()> {
        tx.insert_notification(&crate::notifications::new_notification(
            event_type,
            Some(lease.id.clone()),
            json!({
                "lease_id": lease.id,
                "project_id": lease.project_id,
                // The lease's status, as every other lease notification carries it (the
                // event stream shows it).
                "status": lease.status.to_string(),
                "reservation_id": reservation.id,
                "resource_type": reservation.resource_type(),
                "detail": detail,
            }),
            now,
        ))
        .await?;
        Ok(())
    }

    /// Flags `reservation` and its lease after `lost` units of it left a resource and
    /// `added` were found elsewhere (changed; or missing, the lease degraded, when fewer),
    /// announces it with `detail`, and writes both.
    async fn record_move(
        &self,
        tx: &mut Tx,
        lease: &mut Lease,
        reservation: &mut Reservation,
        (added, lost): (i64, i64),
        detail: serde_json::Value,
        now: DateTime<Utc>,
    ) -> ServiceResult<()> {
        if added >= lost {
            reservation.resources_changed = true;
            self.notify(
                tx,
                "reservation.resources_changed",
                lease,
                reservation,
                detail,
                now,
            )
            .await?;
        } else {
            reservation.missing_resources = true;
            if added > 0 {
                reservation.resources_changed = true;
            }
            lease.degraded = true;
            self.notify(tx, "lease.degraded", lease, reservation, detail, now)
                .await?;
        }
        reservation.updated_at = Some(now);
        tx.update_reservation(reservation).await?;
        lease.updated_at = Some(now);
        tx.update_lease(lease).await?;
        Ok(())
    }

    /// Hands over the allocations of `reservation` that `is_new` picks out: what a change
    /// (healing, an update) added to a reservation in force.
    pub(crate) async fn hand_over_added(
        &self,
        tx: &mut Tx,
        lease: &Lease,
        reservation: &Reservation,
        is_new: impl Fn(&Allocation) -> bool,
        at: DateTime<Utc>,
    ) -> ServiceResult<()> {
        let added: Vec<Allocation> = tx
            .allocations_of_lease(&lease.id)
            .await?
            .into_iter()
            .filter(|a| a.reservation_id == reservation.id && is_new(a))
            .collect();
        self.record_action(
            tx,
            lease,
            reservation,
            (ActionKind::Start, ActionPurpose::Change),
            &added,
            at,
        )
        .await?;
        Ok(())
    }

    /// Tries to give `reservation` `missing` more units over what is left of `[start, end)`.
    async fn refill_reservation(
        &self,
        tx: &mut Tx,
        lease: &Lease,
        reservation: &Reservation,
        window: (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>),
        missing: i64,
        now: DateTime<Utc>,
    ) -> ServiceResult<i64> {
        let start = window.0.max(truncate_to_minute(now));
        let Ok(window_left) = TimeWindow::new(start, window.1) else {
            return Ok(0);
        };
        let existing: Vec<Allocation> = tx
            .allocations_of_lease(&lease.id)
            .await?
            .into_iter()
            .filter(|a| a.reservation_id == reservation.id)
            .collect();
        let before: HashSet<String> = existing.iter().map(|a| a.id.clone()).collect();
        let held: Vec<i64> = existing.iter().map(|a| a.resource_id).collect();
        let request = AllocationRequest {
            lease_id: &lease.id,
            reservation_id: &reservation.id,
            named: ReservationRef::Id(reservation.id.clone()),
            window: window_left,
            blocked_until: window.2,
            keep: &held,
            // Healing's outcome is recorded for operators, never shown to a caller.
            explain: true,
        };
        let added = match self.refill(tx, &reservation.spec, &request, missing).await {
            Ok(n) => n,
            // No replacement is not an error of the operation that triggered healing.
            Err(
                ServiceError::Conflict(_) | ServiceError::BadRequest(_) | ServiceError::Refused(_),
            ) => 0,
            Err(other) => return Err(other),
        };
        if added > 0 && handed_over(lease, reservation) {
            self.hand_over_added(tx, lease, reservation, |a| !before.contains(&a.id), now)
                .await?;
        }
        Ok(added)
    }

    /// Before an inventory change that may move reservations locks its resource's row: on
    /// PostgreSQL, locks the leases it may move (those holding the resource from now on), in
    /// id order. Bookings lock their lease first, then claim resources, then share-lock the
    /// rows; a change that locked the row first and its leases later waited for a lease
    /// whose booking waited for that row, and PostgreSQL broke each such circle only after
    /// `deadlock_timeout`. Taken this way round, the change waits for those bookings, or
    /// they for it, never both. A lease that comes to hold the resource after this read is
    /// locked when it is moved, as before. Leases missing resources are not locked here:
    /// `fill_missing` refills only those it can lock without waiting, and leaves the others
    /// to the next pass.
    pub(crate) async fn lock_leases_to_move(
        &self,
        tx: &mut Tx,
        kind: &str,
        resource_id: i64,
    ) -> ServiceResult<()> {
        if tx.backend() != blazar_db::Backend::Postgres {
            // SQLite writers are serialised: nothing to order.
            return Ok(());
        }
        let now = self.now();
        let mut ids: Vec<String> = tx
            .unended_allocations_of_resource(kind, resource_id, now)
            .await?
            .into_iter()
            .map(|a| a.lease_id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        tx.lock_leases(&refs).await?;
        Ok(())
    }

    /// A resource went out of service: replace it in every reservation that holds it.
    pub(crate) async fn heal_resource(
        &self,
        tx: &mut Tx,
        kind: &str,
        resource_id: i64,
        now: DateTime<Utc>,
    ) -> ServiceResult<()> {
        for allocation in tx
            .unended_allocations_of_resource(kind, resource_id, now)
            .await?
        {
            self.move_allocation(tx, kind, &allocation, now, Unreplaced::Flag)
                .await?;
        }
        Ok(())
    }

    /// A host's capacity for instances may have fallen (new facts or allocation ratios, from
    /// the operator or the cloud): moves instance slots off it, latest booking first
    /// (`engine::overflowing`), only as many as do not fit, until what stays fits at every
    /// instant. The slots that move are replaced elsewhere where they can be, their lease
    /// degraded where they cannot. Returns how many allocations gave up slots.
    pub(crate) async fn shed_overflow(
        &self,
        tx: &mut Tx,
        host_id: i64,
        now: DateTime<Utc>,
    ) -> ServiceResult<usize> {
        let leaving = self.overflow(tx, host_id, now).await?;
        for (allocation, units) in &leaving {
            let (id, reservation, slots, held) = (
                allocation.id.clone(),
                allocation.reservation_id.clone(),
                *units,
                allocation.occupancy.units,
            );
            tx.after_commit(move || {
                tracing::warn!(host.id = host_id, allocation.id = %id,
                    reservation.id = %reservation, slots, held,
                    "instance slots over the host's capacity: moved off it");
            });
            if *units >= allocation.occupancy.units {
                self.move_allocation(tx, PHYSICAL_HOST, allocation, now, Unreplaced::Flag)
                    .await?;
            } else {
                self.move_slots(tx, allocation, *units, now).await?;
            }
        }
        Ok(leaving.len())
    }

    /// The instance-slot allocations a host holds over its capacity, each with how many of
    /// its slots must go (`engine::overflowing`); none when everything fits at every instant.
    async fn overflow(
        &self,
        tx: &mut Tx,
        host_id: i64,
        now: DateTime<Utc>,
    ) -> ServiceResult<Vec<(Allocation, i64)>> {
        let Some(host) = tx.get_host(host_id).await? else {
            return Ok(Vec::new());
        };
        let capacity = crate::instance::capacity(&host, self.settings().ratios);
        // Only allocations that have not ended: any two of them that overlap in the past
        // are both in force now, so the present bounds the past.
        let shared: Vec<Allocation> = tx
            .unended_allocations_of_resource(PHYSICAL_HOST, host_id, now)
            .await?
            .into_iter()
            .filter(|a| !a.occupancy.exclusive)
            .collect();
        let held: Vec<(usize, TimeWindow, Usage, i64)> = shared
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let o = &a.occupancy;
                let window = TimeWindow::new(o.start, o.blocked_until).ok()?;
                let slot = Usage {
                    vcpus: o.vcpus,
                    memory_mb: o.memory_mb,
                    disk_gb: o.disk_gb,
                };
                Some((i, window, slot, o.units))
            })
            .collect();
        Ok(overflowing(capacity, &held)
            .into_iter()
            .filter_map(|(i, units)| Some((shared.get(i)?.clone(), units)))
            .collect())
    }

    /// Moves `units` of an instance-slot allocation's slots off its host, the rest staying
    /// there (servers of the reservation may be running on them): the slots are searched for
    /// elsewhere while the allocation still holds them all, then the allocation shrinks. An
    /// affinity reservation moves whole to one host where one holds it all, as its servers
    /// must share a host. What finds no place is flagged missing and the lease degraded.
    async fn move_slots(
        &self,
        tx: &mut Tx,
        allocation: &Allocation,
        units: i64,
        now: DateTime<Utc>,
    ) -> ServiceResult<()> {
        let Some((mut reservation, mut lease)) = live_holder(tx, allocation).await? else {
            return Ok(());
        };
        let o = &allocation.occupancy;
        let added = self
            .refill_reservation(
                tx,
                &lease,
                &reservation,
                (o.start, o.end, o.blocked_until),
                units,
                now,
            )
            .await?;
        // An affinity reservation that found a host for all of its slots left this one
        // whole; otherwise the allocation keeps what fits.
        let still_here = tx
            .allocations_of_lease(&lease.id)
            .await?
            .into_iter()
            .any(|a| a.id == allocation.id);
        if still_here {
            tx.set_allocation_units(&allocation.id, o.units - units)
                .await?;
            if handed_over(&lease, &reservation) {
                // A hand-over again of what stays: the cloud is brought in line with the
                // slots the reservation holds now (fewer on this host).
                let mut kept = allocation.clone();
                kept.occupancy.units = o.units - units;
                self.record_action(
                    tx,
                    &lease,
                    &reservation,
                    (ActionKind::Start, ActionPurpose::Change),
                    std::slice::from_ref(&kept),
                    now,
                )
                .await?;
            }
        }
        let detail = json!({"resource_id": allocation.resource_id,
                            "resource": allocation.resource_id.to_string(),
                            "kind": PHYSICAL_HOST, "replaced": added, "lost": units});
        self.record_move(
            tx,
            &mut lease,
            &mut reservation,
            (added, units),
            detail,
            now,
        )
        .await?;
        let (lease_id, reservation_id, host_id) = (
            lease.id.clone(),
            reservation.id.clone(),
            allocation.resource_id,
        );
        tx.after_commit(move || {
            tracing::warn!(
                lease.id = %lease_id, reservation.id = %reservation_id,
                host.id = host_id, slots = units, replaced = added,
                "instance slots moved off a host"
            );
        });
        Ok(())
    }

    /// At start-up: the default allocation ratios (flags or file) may have been lowered since
    /// the last run, which lowers the capacity of every host without ratios of its own. Hosts
    /// holding instance slots are read against their capacity now, and the slots over it
    /// move as they do when a host's own ratio is lowered (replaced elsewhere, or the lease
    /// degraded). Only hosts found over capacity are written. Returns how many allocations
    /// moved.
    pub async fn recheck_capacities(&self) -> ServiceResult<usize> {
        let now = self.now();
        let hosts = in_tx!(self, read, |tx| {
            Ok(tx.hosts_holding_slots(PHYSICAL_HOST, now).await?)
        })?;
        let mut over = Vec::new();
        // A few hundred hosts a read transaction, so none stays open long.
        for batch in hosts.chunks(256) {
            let found = in_tx!(self, read, |tx| {
                let mut found = Vec::new();
                for &id in batch {
                    if !self.overflow(tx, id, now).await?.is_empty() {
                        found.push(id);
                    }
                }
                Ok(found)
            })?;
            over.extend(found);
        }
        let mut moved = 0;
        for id in over {
            moved += in_tx!(self, write, |tx| {
                self.lock_leases_to_move(tx, PHYSICAL_HOST, id).await?;
                // Checked again under the host's lock: another replica may have done it.
                if !tx.lock_host(id).await? {
                    return Ok(0);
                }
                let now = self.now();
                let moved = self.shed_overflow(tx, id, now).await?;
                if moved > 0 {
                    self.fill_missing(tx, now).await?;
                }
                Ok(moved)
            })?;
        }
        if moved > 0 {
            tracing::warn!(
                allocations = moved,
                "instance slots over their hosts' capacity at start-up (allocation ratios \
                 lowered?): moved off them"
            );
        }
        Ok(moved)
    }

    /// Moves one allocation of a live reservation off its resource: a replacement matching
    /// the reservation is searched while the allocation still holds the resource (so the
    /// resource itself is never the replacement), then the allocation goes. Without a
    /// replacement the reservation is flagged `missing_resources` and its lease `degraded`,
    /// unless `unreplaced` says to keep it where it is (a move asked for while the resource
    /// stays in service: taking it away would only have healing hand it back).
    pub(crate) async fn move_allocation(
        &self,
        tx: &mut Tx,
        kind: &str,
        allocation: &Allocation,
        now: DateTime<Utc>,
        unreplaced: Unreplaced,
    ) -> ServiceResult<Moved> {
        let Some((mut reservation, mut lease)) = live_holder(tx, allocation).await? else {
            return Ok(Moved::NotLive);
        };
        let resource_id = allocation.resource_id;
        let wanted = allocation.occupancy.units;
        // Hosts are known by their number; the other kinds by their record.
        let record = match kind {
            PHYSICAL_HOST => None,
            _ => tx.resources_named(kind, &[resource_id]).await?.pop(),
        };
        // A required floating IP is the address its user named: no other stands in for it,
        // the reservation waits for it (flagged as missing it) instead.
        let added = if is_required_address(&reservation.spec, record.as_ref()) {
            0
        } else {
            self.refill_reservation(
                tx,
                &lease,
                &reservation,
                (
                    allocation.occupancy.start,
                    allocation.occupancy.end,
                    allocation.occupancy.blocked_until,
                ),
                wanted,
                now,
            )
            .await?
        };
        if added == 0 && unreplaced == Unreplaced::Keep {
            return Ok(Moved::Kept);
        }
        tx.delete_allocation(&allocation.id).await?;
        if handed_over(&lease, &reservation) {
            self.record_action(
                tx,
                &lease,
                &reservation,
                (ActionKind::Stop, ActionPurpose::Change),
                std::slice::from_ref(allocation),
                now,
            )
            .await?;
        }
        // `resource` is the id the resource's own API knows it by (hosts: the same number).
        let resource = record.map_or_else(|| resource_id.to_string(), |r| r.resource.uid);
        let detail = json!({"resource_id": resource_id, "resource": resource, "kind": kind,
                            "replaced": added, "lost": wanted});
        self.record_move(
            tx,
            &mut lease,
            &mut reservation,
            (added, wanted),
            detail,
            now,
        )
        .await?;
        let (lease_id, reservation_id, kind) =
            (lease.id.clone(), reservation.id.clone(), kind.to_string());
        tx.after_commit(move || {
            tracing::warn!(
                lease.id = %lease_id, reservation.id = %reservation_id, resource.kind = %kind,
                resource.id = resource_id, replaced = added, "reservation moved off a resource"
            );
        });
        Ok(Moved::Away)
    }

    /// Fills reservations that are missing resources, where resources are free again; clears
    /// their flags, and a lease's `degraded` once none of its reservations is missing any.
    pub(crate) async fn fill_missing(
        &self,
        tx: &mut Tx,
        now: DateTime<Utc>,
    ) -> ServiceResult<usize> {
        let mut healed = 0;
        for mut reservation in tx.reservations_missing_resources().await? {
            // A lease another transaction holds is left to the next pass (the scheduler's
            // `heal_pending`, every poll): waiting here, holding the rows and claims of
            // the change that called, could close a circle with it.
            let Some(mut lease) = tx.try_lock_lease(&reservation.lease_id).await? else {
                continue;
            };
            // Stamped now, not when the caller began: the scheduler's pass calls after its
            // events, and a resource freed by a change it waited for must not be handed over
            // from before that change let go of it.
            let now = now.max(self.now());
            if lease.end <= now {
                continue;
            }
            let held: i64 = tx
                .allocations_of_lease(&lease.id)
                .await?
                .iter()
                .filter(|a| a.reservation_id == reservation.id && a.occupancy.end > now)
                .map(|a| a.occupancy.units)
                .sum();
            let missing = reservation.granted_units - held;
            let blocked_until = lease.end + self.settings().cleaning();
            let added = if missing > 0 {
                self.refill_reservation(
                    tx,
                    &lease,
                    &reservation,
                    (lease.start, lease.end, blocked_until),
                    missing,
                    now,
                )
                .await?
            } else {
                0
            };
            let whole = added >= missing;
            if !whole && added == 0 {
                continue;
            }
            // Whole again, or part of what it lacks is back: said now, not only once all is.
            reservation.missing_resources = !whole;
            reservation.resources_changed = true;
            reservation.updated_at = Some(now);
            tx.update_reservation(&reservation).await?;
            if !whole {
                self.notify(
                    tx,
                    "reservation.resources_changed",
                    &lease,
                    &reservation,
                    json!({"added": added, "missing": missing - added}),
                    now,
                )
                .await?;
                continue;
            }
            let others = tx.reservations_of(&lease.id).await?;
            if !others
                .iter()
                .any(|r| r.id != reservation.id && r.missing_resources)
            {
                lease.degraded = false;
                lease.updated_at = Some(now);
                tx.update_lease(&lease).await?;
            }
            self.notify(
                tx,
                "lease.healed",
                &lease,
                &reservation,
                json!({"added": added}),
                now,
            )
            .await?;
            healed += 1;
        }
        Ok(healed)
    }

    /// Periodic healing from the scheduler: a cheap read first, a write only when some
    /// reservation is missing resources.
    pub(crate) async fn heal_pending(&self, now: DateTime<Utc>) -> ServiceResult<usize> {
        let waiting = in_tx!(self, read, |tx| {
            Ok(!tx.reservations_missing_resources().await?.is_empty())
        })?;
        if !waiting {
            return Ok(0);
        }
        in_tx!(self, write, |tx| { self.fill_missing(tx, now).await })
    }

    /// A page of the notification outbox (of one lease, or all), oldest first: up to
    /// `limit` after place `after`, each with its place to resume after.
    pub async fn notifications(
        &self,
        identity: &crate::Identity,
        lease_id: Option<&str>,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> ServiceResult<Vec<((i64, String), Notification)>> {
        self.authorize_own("admin", identity)?;
        in_tx!(self, read, |tx| {
            Ok(tx.outbox_page(lease_id, after, limit).await?)
        })
    }
}
