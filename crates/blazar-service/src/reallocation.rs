//! Re-allocation (Chameleon's `PUT /v1/os-hosts/{id}/allocation` and
//! `PUT /v1/devices/{id}/allocation`): moves the reservations holding a host or a device onto
//! another one that matches them, for what is left of their leases, as healing does for a
//! resource that went out of service, but on demand and while the resource stays reservable.

use crate::healing::{Moved, Unreplaced};
use crate::hosts::{AllocationEntry, host_not_found, parse_host_id};
use crate::inventory::{DEVICES, not_found};
use crate::leases::{lease_not_found, lease_target};
use crate::pool::DEVICE;
use crate::{Identity, Service, ServiceError, ServiceResult};
use blazar_core::PHYSICAL_HOST;

/// Which reservations of the resource to move: all of them, one lease's, or one reservation.
#[derive(Debug, Clone, Default)]
pub struct ReallocationFilter {
    pub lease_id: Option<String>,
    pub reservation_id: Option<String>,
}

/// What a re-allocation moved, and the reservations nothing was free for.
#[derive(Debug, Default)]
struct Outcome {
    moved: usize,
    kept: Vec<String>,
}

/// What can be re-allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reallocated {
    Host,
    Device,
}

impl Service {
    /// Moves the matching reservations off host or device `id`. For a host, with a
    /// `lease_id`, the lease's owner may ask (`blazar:leases:reallocate`); otherwise it is an
    /// operator's action (`blazar:oshosts:reallocate`, `blazar:devices:reallocate`).
    pub async fn reallocate(
        &self,
        identity: &Identity,
        what: Reallocated,
        id: &str,
        filter: &ReallocationFilter,
    ) -> ServiceResult<AllocationEntry> {
        // A host id is checked before the policy, a device is looked up after it.
        let host_id = match what {
            Reallocated::Host => {
                let host_id = parse_host_id(id)?;
                self.authorize_host_reallocation(identity, filter).await?;
                Some(host_id)
            }
            Reallocated::Device => {
                self.authorize_own("blazar:devices:reallocate", identity)?;
                None
            }
        };
        let entry = in_tx!(self, write, |tx| {
            let (kind, resource_id, shown_id) = match host_id {
                Some(host_id) => {
                    self.lock_leases_to_move(tx, PHYSICAL_HOST, host_id).await?;
                    if !tx.lock_host(host_id).await? {
                        return Err(host_not_found(id));
                    }
                    (PHYSICAL_HOST, host_id, id.to_string())
                }
                None => {
                    let record = tx
                        .get_resource(DEVICE, id)
                        .await?
                        .ok_or_else(|| not_found(&DEVICES, id))?;
                    self.lock_leases_to_move(tx, DEVICE, record.id).await?;
                    if !tx.lock_resource(record.id).await? {
                        return Err(not_found(&DEVICES, id));
                    }
                    (DEVICE, record.id, record.resource.uid)
                }
            };
            let outcome = self
                .move_reservations(tx, kind, resource_id, filter)
                .await?;
            // Nothing could go anywhere: said, rather than answered as if it had moved.
            if outcome.moved == 0
                && let Some(kept) = outcome.kept.first()
            {
                let what = match what {
                    Reallocated::Host => "host",
                    Reallocated::Device => "device",
                };
                return Err(ServiceError::Conflict(format!(
                    "No other {what} matching reservation {kept} is free for the rest of its \
                     lease; it keeps {what} {shown_id}"
                )));
            }
            self.allocation_entry(tx, kind, resource_id, shown_id, filter)
                .await
        })?;
        Ok(entry)
    }

    async fn authorize_host_reallocation(
        &self,
        identity: &Identity,
        filter: &ReallocationFilter,
    ) -> ServiceResult<()> {
        match &filter.lease_id {
            Some(lease_id) => {
                let lease = in_tx!(self, read, |tx| {
                    tx.get_lease(lease_id)
                        .await?
                        .ok_or_else(|| lease_not_found(lease_id))
                })?;
                self.authorize("blazar:leases:reallocate", identity, &lease_target(&lease))
            }
            None => self.authorize_own("blazar:oshosts:reallocate", identity),
        }
    }

    /// Moves every live reservation of type `kind` that holds the resource for the future and
    /// passes the filter, where another matching resource is free for it; the others keep
    /// the resource. Instance slots on a host are not moved: they share the host with others
    /// and heal on their own when it goes out of service.
    async fn move_reservations(
        &self,
        tx: &mut blazar_db::Tx,
        kind: &str,
        resource_id: i64,
        filter: &ReallocationFilter,
    ) -> ServiceResult<Outcome> {
        let now = self.now();
        let mut outcome = Outcome::default();
        for allocation in tx
            .unended_allocations_of_resource(kind, resource_id, now)
            .await?
        {
            if filter
                .lease_id
                .as_deref()
                .is_some_and(|l| l != allocation.lease_id)
                || filter
                    .reservation_id
                    .as_deref()
                    .is_some_and(|r| r != allocation.reservation_id)
            {
                continue;
            }
            let Some(reservation) = tx.get_reservation(&allocation.reservation_id).await? else {
                continue;
            };
            if reservation.resource_type() != kind {
                continue;
            }
            match self
                .move_allocation(tx, kind, &allocation, now, Unreplaced::Keep)
                .await?
            {
                Moved::Away => outcome.moved += 1,
                Moved::Kept => outcome.kept.push(reservation.id),
                Moved::NotLive => {}
            }
        }
        Ok(outcome)
    }

    /// The resource's allocations after the move, as `GET .../allocation` with the same
    /// filters shows them.
    async fn allocation_entry(
        &self,
        tx: &mut blazar_db::Tx,
        kind: &str,
        resource_id: i64,
        shown_id: String,
        filter: &ReallocationFilter,
    ) -> ServiceResult<AllocationEntry> {
        let reservations = tx
            .allocation_views(
                kind,
                Some(resource_id),
                filter.lease_id.as_deref(),
                filter.reservation_id.as_deref(),
                self.now(),
            )
            .await?;
        Ok(AllocationEntry {
            resource_id: shown_id,
            reservations,
        })
    }
}
