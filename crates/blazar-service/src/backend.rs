//! Backends: what happens in the outside world when a lease starts and ends.
//!
//! A backend runs inside the scheduler's transaction. The standalone backend records the
//! hand-over in the database, so it commits or rolls back with the event itself and an event
//! takes effect exactly once.

use async_trait::async_trait;
use blazar_db::{AllocationRow, HandoverRow, LeaseRow, ReservationRow, Tx};
use chrono::{DateTime, Utc};

use crate::ServiceResult;

#[async_trait]
pub trait Backend: Send + Sync {
    /// Hands the allocated resources to the lease's project.
    async fn on_start(
        &self,
        tx: &mut Tx,
        lease: &LeaseRow,
        reservation: &ReservationRow,
        allocations: &[AllocationRow],
        now: DateTime<Utc>,
    ) -> ServiceResult<()>;

    /// Takes the resources back (at lease end, lease delete, or when an update releases some).
    async fn on_end(
        &self,
        tx: &mut Tx,
        lease: &LeaseRow,
        reservation: &ReservationRow,
        allocations: &[AllocationRow],
        now: DateTime<Utc>,
    ) -> ServiceResult<()>;
}

/// For sites without OpenStack: hand-overs are records, visible through the API.
pub struct StandaloneBackend;

#[async_trait]
impl Backend for StandaloneBackend {
    async fn on_start(
        &self,
        tx: &mut Tx,
        lease: &LeaseRow,
        reservation: &ReservationRow,
        allocations: &[AllocationRow],
        now: DateTime<Utc>,
    ) -> ServiceResult<()> {
        for allocation in allocations {
            tx.start_handover(&HandoverRow {
                resource_type: allocation.resource_type.clone(),
                resource_id: allocation.resource_id,
                project_id: lease.project_id.clone(),
                lease_id: lease.id.clone(),
                reservation_id: reservation.id.clone(),
                started_at: now,
                ended_at: None,
            })
            .await?;
            tracing::info!(
                lease.id = %lease.id,
                project.id = %lease.project_id,
                resource.type = %allocation.resource_type,
                resource.id = allocation.resource_id,
                "resource handed over"
            );
        }
        Ok(())
    }

    async fn on_end(
        &self,
        tx: &mut Tx,
        lease: &LeaseRow,
        reservation: &ReservationRow,
        allocations: &[AllocationRow],
        now: DateTime<Utc>,
    ) -> ServiceResult<()> {
        for allocation in allocations {
            tx.end_handovers(&reservation.id, Some(allocation.resource_id), now)
                .await?;
            tracing::info!(
                lease.id = %lease.id,
                resource.type = %allocation.resource_type,
                resource.id = allocation.resource_id,
                "resource taken back"
            );
        }
        Ok(())
    }
}
