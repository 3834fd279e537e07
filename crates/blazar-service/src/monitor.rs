//! The host monitor: asks the backend which hosts are healthy and acts as Blazar's polling
//! monitor does. A failed host (compute service down or disabled) becomes non-reservable and
//! the reservations holding it are healed onto others; when it is healthy again it becomes
//! reservable and reservations missing hosts are filled. Only hosts the monitor itself took
//! out (status `down`) are put back: a host an operator took out stays out. The facts the
//! cloud reports (vCPUs, memory, disk, versions) replace the inventory's when they changed.

use std::future::Future;

use blazar_core::PHYSICAL_HOST;

use crate::{Service, ServiceError, ServiceResult};

/// The status the monitor gives a host it found failed.
pub const MONITOR_DOWN: &str = "down";

/// What one pass of the monitor did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorReport {
    /// Hypervisor hostnames taken out of service.
    pub failed: Vec<String>,
    /// Hypervisor hostnames put back.
    pub recovered: Vec<String>,
    /// Hypervisor hostnames whose facts changed in the cloud and were updated.
    pub refreshed: Vec<String>,
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
            if !healthy && host.reservable {
                in_tx!(self, write, |tx| {
                    let now = self.now();
                    tx.set_host_health(host.id, false, Some(MONITOR_DOWN), now)
                        .await?;
                    self.heal_resource(tx, PHYSICAL_HOST, host.id, now).await
                })?;
                tracing::warn!(host = %host.facts.hypervisor_hostname, reason = %reason,
                    "host failed: no longer reservable, its reservations healed");
                report.failed.push(host.facts.hypervisor_hostname.clone());
            } else if healthy && !host.reservable && down_by_monitor {
                in_tx!(self, write, |tx| {
                    let now = self.now();
                    tx.set_host_health(host.id, true, None, now).await?;
                    self.fill_missing(tx, now).await
                })?;
                tracing::info!(host = %host.facts.hypervisor_hostname, "host recovered: reservable again");
                report
                    .recovered
                    .push(host.facts.hypervisor_hostname.clone());
            }
        }
        Ok(report)
    }

    /// Runs the monitor every `interval` until `shutdown`, when this replica takes the
    /// interval's turn (`take_turn`): one pass an interval among replicas.
    pub async fn run_monitor(
        &self,
        interval: std::time::Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            match self.take_turn(crate::MONITOR_TURN, interval).await {
                Ok(true) => {
                    if let Err(e) = self.monitor_hosts().await {
                        tracing::warn!(error = %e,
                            "host monitor pass failed; trying again at the next one");
                    }
                }
                // Another replica's monitor took this interval's turn.
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "host monitor could not take its turn"),
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = &mut shutdown => break,
            }
        }
    }
}
