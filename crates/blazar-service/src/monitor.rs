//! The host monitor: asks the backend which hosts are healthy and acts as Blazar's polling
//! monitor does. A failed host (compute service down or disabled) becomes non-reservable and
//! the reservations holding it are healed onto others; when it is healthy again it becomes
//! reservable and reservations missing hosts are filled. Only hosts the monitor itself took
//! out (status `down`) are put back: a host an operator took out stays out. The facts the
//! cloud reports (vCPUs, memory, disk, versions) replace the inventory's when they changed.
//! Floating IPs and network segments are watched the same way: one that something outside
//! blazar-rs holds in the cloud (another project made a floating IP with the address, or a
//! network on the segment) cannot be handed over, so it is taken out (status `taken`) and
//! its reservations are healed onto others, the lease degraded where none is free; it comes
//! back when the cloud lets it go.

use std::future::Future;

use blazar_core::PHYSICAL_HOST;
use blazar_core::reservation::{FLOATINGIP, NETWORK};

use crate::backend::PoolCheck;

use crate::{Service, ServiceError, ServiceResult};

/// The status the monitor gives a host it found failed.
pub const MONITOR_DOWN: &str = "down";

/// The status the monitor gives a floating IP or segment held outside blazar-rs.
pub const MONITOR_TAKEN: &str = "taken";

/// What one pass of the monitor did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorReport {
    /// Hypervisor hostnames taken out of service.
    pub failed: Vec<String>,
    /// Hypervisor hostnames put back.
    pub recovered: Vec<String>,
    /// Hypervisor hostnames whose facts changed in the cloud and were updated.
    pub refreshed: Vec<String>,
    /// Floating IPs and segments (by their names: address, `physnet:segment`) found held
    /// outside blazar-rs and taken out of service.
    pub taken: Vec<String>,
    /// Floating IPs and segments the cloud let go of, put back.
    pub freed: Vec<String>,
}

impl Service {
    /// One pass of the monitor.
    pub async fn monitor_hosts(&self) -> ServiceResult<MonitorReport> {
        let mut report = MonitorReport::default();
        let health = match self.backend.host_health().await {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(report),
            Err(e) => return Err(ServiceError::Unavailable(e.to_string())),
        };
        // The trait sets flavors asked for, as Placement answers them now: what healing
        // places flavor:instance slots by.
        for traits in self.trait_hosts.known() {
            match self.backend.hosts_with_traits(&traits).await {
                Ok(Some(hosts)) => self.trait_hosts.remember(&traits, hosts),
                Ok(None) => {}
                // The last answer stays; the next pass asks again.
                Err(e) => tracing::warn!(error = %e, "placement traits not refreshed"),
            }
        }
        let hosts = in_tx!(self, read, |tx| { Ok(tx.list_hosts().await?) })?;
        if health.is_empty() && !hosts.is_empty() {
            // A cloud that lists no hypervisor at all is more likely restarting than empty:
            // failing every host on its word would heal every reservation away.
            tracing::warn!("the cloud lists no hypervisor: host health not checked this pass");
            return Ok(report);
        }
        for host in hosts {
            let found = health
                .iter()
                .find(|h| h.hypervisor_hostname == host.facts.hypervisor_hostname);
            // A host the cloud no longer lists (its compute service deleted) cannot serve
            // anyone: failed, as a host that is down.
            let (healthy, reason) = match found {
                Some(state) => (state.healthy, state.reason.clone()),
                None => (false, "not among the cloud's hypervisors".to_string()),
            };
            // Facts first: they decide what the host can be granted for.
            if let Some(mut facts) = found.and_then(|state| state.facts.clone()) {
                // The inventory's own name for the host stays, and so does its zone: the
                // cloud's moves with the aggregate the host is in (a reservation's zone while
                // it is reserved).
                facts.hypervisor_hostname = host.facts.hypervisor_hostname.clone();
                facts.availability_zone = host.facts.availability_zone.clone();
                if facts != host.facts {
                    in_tx!(self, write, |tx| {
                        self.lock_leases_to_move(tx, PHYSICAL_HOST, host.id).await?;
                        let now = self.now();
                        tx.update_host_facts(host.id, &facts, host.reservable, now)
                            .await?;
                        // Instance slots over a lower capacity move elsewhere; a higher
                        // one may fill reservations missing some.
                        if host.reservable {
                            self.shed_overflow(tx, host.id, now).await?;
                            self.fill_missing(tx, now).await?;
                        }
                        Ok(())
                    })?;
                    tracing::info!(host = %host.facts.hypervisor_hostname,
                        vcpus = facts.vcpus, memory_mb = facts.memory_mb, local_gb = facts.local_gb,
                        "host facts refreshed from the cloud");
                    report
                        .refreshed
                        .push(host.facts.hypervisor_hostname.clone());
                }
            }
            let down_by_monitor = host.status.as_deref() == Some(MONITOR_DOWN);
            // Each change is decided again on the host as it is under the lock: another pass
            // (a replica's, or one Nova's notification started) may have made it since the
            // list was read, and its later news must not be undone by this pass's older one.
            if !healthy && host.reservable {
                let failed = in_tx!(self, write, |tx| {
                    self.lock_leases_to_move(tx, PHYSICAL_HOST, host.id).await?;
                    if !tx.get_host(host.id).await?.is_some_and(|h| h.reservable) {
                        return Ok(false);
                    }
                    let now = self.now();
                    tx.set_host_health(host.id, false, Some(MONITOR_DOWN), now)
                        .await?;
                    self.heal_resource(tx, PHYSICAL_HOST, host.id, now).await?;
                    Ok(true)
                })?;
                if failed {
                    tracing::warn!(host = %host.facts.hypervisor_hostname, reason = %reason,
                        "host failed: no longer reservable, its reservations healed");
                    report.failed.push(host.facts.hypervisor_hostname.clone());
                }
            } else if healthy && !host.reservable && down_by_monitor {
                let recovered = in_tx!(self, write, |tx| {
                    self.lock_leases_to_move(tx, PHYSICAL_HOST, host.id).await?;
                    let down = tx.get_host(host.id).await?.is_some_and(|h| {
                        !h.reservable && h.status.as_deref() == Some(MONITOR_DOWN)
                    });
                    if !down {
                        return Ok(false);
                    }
                    let now = self.now();
                    tx.set_host_health(host.id, true, None, now).await?;
                    self.fill_missing(tx, now).await?;
                    Ok(true)
                })?;
                if recovered {
                    tracing::info!(host = %host.facts.hypervisor_hostname, "host recovered: reservable again");
                    report
                        .recovered
                        .push(host.facts.hypervisor_hostname.clone());
                }
            }
        }
        Ok(report)
    }

    /// One pass of the monitor over floating IPs and network segments: what the cloud shows
    /// held outside blazar-rs is taken out and its reservations healed; what the monitor took
    /// out and the cloud let go of is put back, and reservations missing resources filled.
    pub async fn monitor_pools(&self) -> ServiceResult<MonitorReport> {
        let mut report = MonitorReport::default();
        let checks = in_tx!(self, read, |tx| {
            let now = self.now();
            let mut checks = Vec::new();
            for kind in [FLOATINGIP, NETWORK] {
                let mut holding = tx.projects_holding_now(kind, now).await?;
                for record in tx.list_resources(kind).await? {
                    let holder_project = holding.remove(&record.id);
                    checks.push(PoolCheck {
                        record,
                        holder_project,
                    });
                }
            }
            Ok(checks)
        })?;
        if checks.is_empty() {
            return Ok(report);
        }
        let taken = match self.backend.pools_taken(&checks).await {
            Ok(Some(taken)) => taken,
            Ok(None) => return Ok(report),
            Err(e) => return Err(ServiceError::Unavailable(e.to_string())),
        };
        for check in checks {
            let record = &check.record;
            let kind = record.resource.kind.as_str();
            let name = record.resource.display_name();
            let holder = taken.get(&record.id);
            let took_out = record.status.as_deref() == Some(MONITOR_TAKEN);
            if let Some(holder) = holder.filter(|_| record.resource.reservable) {
                if self.take_out_held(kind, record.id, holder).await? {
                    report.taken.push(name);
                }
            } else if holder.is_none()
                && !record.resource.reservable
                && took_out
                && self.put_back_released(kind, record.id).await?
            {
                report.freed.push(name);
            }
        }
        Ok(report)
    }

    /// Takes resource `id` of `kind` out of service because `holder` holds it in the cloud
    /// outside blazar-rs (status `taken`, put back by the monitor when it is let go), and
    /// heals the reservations holding it. False when it is out already or gone.
    pub(crate) async fn take_out_held(
        &self,
        kind: &str,
        id: i64,
        holder: &str,
    ) -> ServiceResult<bool> {
        let taken = in_tx!(self, write, |tx| {
            self.lock_leases_to_move(tx, kind, id).await?;
            // Read under its lock: an operator may have changed it meanwhile.
            if !tx.lock_resource(id).await? {
                return Ok(None);
            }
            let Some(record) = tx.resources_named(kind, &[id]).await?.pop() else {
                return Ok(None);
            };
            if !record.resource.reservable {
                return Ok(None);
            }
            let now = self.now();
            tx.set_resource_health(id, false, Some(MONITOR_TAKEN), now)
                .await?;
            self.heal_resource(tx, kind, id, now).await?;
            Ok(Some(record.resource.display_name()))
        })?;
        let Some(name) = taken else {
            return Ok(false);
        };
        tracing::warn!(resource.kind = kind, resource = %name, held_by = holder,
            "held outside blazar-rs: no longer reservable, its reservations healed");
        Ok(true)
    }

    /// Puts resource `id` of `kind`, which the monitor took out and the cloud let go of,
    /// back in service, and fills reservations missing resources. False when it is no
    /// longer the monitor's to put back (an operator decided since) or gone.
    async fn put_back_released(&self, kind: &str, id: i64) -> ServiceResult<bool> {
        let freed = in_tx!(self, write, |tx| {
            self.lock_leases_to_move(tx, kind, id).await?;
            // Read under its lock, as `take_out_held` does.
            if !tx.lock_resource(id).await? {
                return Ok(None);
            }
            let Some(record) = tx.resources_named(kind, &[id]).await?.pop() else {
                return Ok(None);
            };
            if record.resource.reservable || record.status.as_deref() != Some(MONITOR_TAKEN) {
                return Ok(None);
            }
            let now = self.now();
            tx.set_resource_health(id, true, None, now).await?;
            self.fill_missing(tx, now).await?;
            Ok(Some(record.resource.display_name()))
        })?;
        let Some(name) = freed else {
            return Ok(false);
        };
        tracing::info!(resource.kind = kind, resource = %name,
            "let go of in the cloud: reservable again");
        Ok(true)
    }

    /// Runs the monitor every `interval` until `shutdown`, when this replica takes the
    /// interval's turn (`take_turn`): one pass an interval among replicas. Each time `wake`
    /// is notified (Nova said a compute service changed) a host pass runs at once as well,
    /// whoever has the turn, at most one a second: the notification is only a trigger, and
    /// the pass reads the hosts' health from the cloud as a timed one does.
    pub async fn run_monitor(
        &self,
        interval: std::time::Duration,
        wake: Option<std::sync::Arc<tokio::sync::Notify>>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        // Without notifications, a wake that never comes.
        let wake = wake.unwrap_or_default();
        loop {
            match self.take_turn(crate::MONITOR_TURN, interval).await {
                Ok(true) => {
                    if let Err(e) = self.monitor_hosts().await {
                        tracing::warn!(error = %e,
                            "host monitor pass failed; trying again at the next one");
                    }
                    if let Err(e) = self.monitor_pools().await {
                        tracing::warn!(error = %e,
                            "floating IP and segment monitor pass failed; trying again at the next one");
                    }
                }
                // Another replica's monitor took this interval's turn.
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "host monitor could not take its turn"),
            }
            let next = tokio::time::Instant::now() + interval;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(next) => break,
                    () = wake.notified() => {
                        match self.monitor_hosts().await {
                            Ok(report) => tracing::info!(failed = ?report.failed,
                                recovered = ?report.recovered, "host monitor pass on Nova's word done"),
                            Err(e) => tracing::warn!(error = %e,
                                "host monitor pass on Nova's word failed; the timed passes go on"),
                        }
                        // Notifications of a burst (a rack's computes disabled together)
                        // come to one pass or two, not one each.
                        tokio::select! {
                            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                            () = &mut shutdown => return,
                        }
                    }
                    () = &mut shutdown => return,
                }
            }
        }
    }
}
