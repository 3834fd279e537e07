//! Backends: what happens in the outside world when resources are handed over and taken back.
//!
//! The transaction that decides a change (a lease start or end, an update, a delete, healing)
//! records it as actions (`actions.rs`); a backend carries one action out after commit,
//! outside any transaction and lock. An action may run more than once (a worker can die after
//! acting and before recording it), so every backend makes each action idempotent: doing it
//! twice leaves the world as doing it once.

use async_trait::async_trait;
use blazar_core::Handover;
use blazar_core::{ActionKind, ActionPurpose, HostFacts, MadeIds, ReservationSpec};
use blazar_db::Store;
use chrono::{DateTime, Utc};

/// One action as a backend receives it: everything needed to carry it out.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    pub seq: i64,
    pub kind: ActionKind,
    pub purpose: ActionPurpose,
    pub lease_id: String,
    pub lease_name: String,
    pub reservation_id: String,
    pub project_id: String,
    pub user_id: String,
    /// The type of the resources it names (`physical:host` for instance slots too).
    pub resource_type: String,
    /// The reservation's type (`physical:host`, `virtual:instance`, ...).
    pub reservation_type: String,
    /// The resources it hands over or takes back (ids in blazar-rs's inventory).
    pub resources: Vec<i64>,
    /// Units of each resource, in the same order (instance slots per host; 1 otherwise).
    pub units: Vec<i64>,
    /// For inventory actions on hosts: (service name, hypervisor hostname) of each resource,
    /// in the same order (the host may be gone from the inventory by the time it runs).
    pub hosts: Vec<(String, String)>,
    /// What the reservation asks for (`None` only for an action recorded by an older
    /// version whose fields no longer read).
    pub spec: Option<ReservationSpec>,
    pub lease_start: DateTime<Utc>,
    pub lease_end: DateTime<Utc>,
    /// When the change took effect (the event's time, or the request's).
    pub at: DateTime<Utc>,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The request id of the API call that caused it, for outbound calls.
    pub request_id: Option<String>,
    /// The Keystone trust the lease's user gave the service (`act_for_user = trust`), to act
    /// in the user's project through; `None` for leases made in another mode.
    pub trust_id: Option<String>,
}

/// Why an action did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// Worth trying again later: the outside world was unreachable, busy or in the middle
    /// of something.
    #[error("{0}")]
    Transient(String),
    /// Trying again cannot help (refused, invalid); the reason is shown to operators.
    #[error("{0}")]
    Permanent(String),
}

/// What the cloud says of one host's health.
#[derive(Debug, Clone, PartialEq)]
pub struct HostHealth {
    pub hypervisor_hostname: String,
    /// Up and enabled: it may take reservations.
    pub healthy: bool,
    /// Why not, for the log (`state=down`, `status=disabled`).
    pub reason: String,
    /// What the cloud says the host is now (hypervisor facts), when it says: the monitor
    /// keeps the inventory's facts in step (a resized hypervisor, an upgraded one).
    pub facts: Option<HostFacts>,
}

/// An enrolled floating IP or network segment, as the monitor asks the cloud about it.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolCheck {
    pub record: blazar_core::ResourceRecord,
    /// The project of the lease that holds it now, if one does: what that project made on
    /// it itself (a floating IP it deleted and made again) is not taken from it.
    pub holder_project: Option<String>,
}

/// Why the cloud refuses a host's enrolment or withdrawal as asked, or could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InventoryError {
    /// The cloud has no such host (404).
    #[error("{0}")]
    NotFound(String),
    /// The cloud refuses it as it is (409): servers on it, several matches.
    #[error("{0}")]
    Conflict(String),
    /// The cloud refuses the request as given (400).
    #[error("{0}")]
    Invalid(String),
    /// The cloud could not be asked (503).
    #[error("{0}")]
    Unavailable(String),
}

impl From<InventoryError> for crate::ServiceError {
    fn from(e: InventoryError) -> Self {
        match e {
            InventoryError::NotFound(m) => crate::ServiceError::NotFound(m),
            InventoryError::Conflict(m) => crate::ServiceError::Conflict(m),
            InventoryError::Invalid(m) => crate::ServiceError::BadRequest(m),
            InventoryError::Unavailable(m) => crate::ServiceError::Unavailable(m),
        }
    }
}

/// What carrying out an action made that its reservation shows from then on (the id Nova
/// gave the server group of an instance reservation), and the hand-over records it changed
/// (the standalone backend's whole effect). Both are written in the transaction that
/// records the action done, so they are never seen without it, nor it without them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActionOutput {
    /// The ids Nova gave the instance reservation's server group and aggregate.
    pub made: MadeIds,
    pub handovers: Vec<HandoverChange>,
    /// Resources of a start that something outside blazar-rs holds in the cloud (another
    /// project's floating IP on a reserved address): not handed over, the rest were. The
    /// service takes them out of service and heals the reservation, as the monitor does.
    pub held_outside: Vec<i64>,
}

/// A change to the records of who holds a resource now.
#[derive(Debug, Clone, PartialEq)]
pub enum HandoverChange {
    /// The resource is handed over (an upsert: writing it twice changes nothing).
    Start(Handover),
    /// The reservation's hold on the resource ends at `at` (closing it twice changes
    /// nothing).
    End {
        reservation_id: String,
        resource_id: i64,
        at: DateTime<Utc>,
    },
}

#[async_trait]
pub trait Backend: Send + Sync {
    /// Carries out one action. `store` is there to read what the backend needs (the names
    /// of hosts); a backend never writes it: what it changed travels back in the output,
    /// written with the outcome.
    async fn apply(&self, store: &Store, action: &Action) -> Result<ActionOutput, ActionError>;

    /// The facts of the host named `name`, from the cloud, before it is enrolled. `None`:
    /// this backend has no inventory of its own; the request's facts stand.
    async fn describe_host(&self, _name: &str) -> Result<Option<HostFacts>, InventoryError> {
        Ok(None)
    }

    /// Whether the cloud lets the enrolled host `facts` describes be withdrawn: Blazar
    /// refuses a host with servers on it (409), where a healed lease's servers may still
    /// run. Asked before the withdrawal's transaction, never inside it.
    async fn check_withdrawal(&self, _facts: &HostFacts) -> Result<(), InventoryError> {
        Ok(())
    }

    /// What the cloud states of a host being enrolled beyond its facts, as extra
    /// capabilities (the allocation ratios and custom traits Placement has for it); the
    /// request's own capabilities take precedence.
    async fn host_capabilities(
        &self,
        _facts: &HostFacts,
    ) -> Result<std::collections::BTreeMap<String, String>, InventoryError> {
        Ok(std::collections::BTreeMap::new())
    }

    /// The flavor a `flavor:instance` reservation names, as `identity` sees it in the cloud
    /// (Nova's shape: `id`, `name`, `vcpus`, `ram`, `disk`, `OS-FLV-EXT-DATA:ephemeral`,
    /// `extra_specs`); `NotFound` when the caller cannot see it. `None` when this backend
    /// keeps no flavors: the service's own registry answers.
    async fn flavor(
        &self,
        _identity: &crate::Identity,
        _id_or_name: &str,
    ) -> Result<Option<serde_json::Value>, InventoryError> {
        Ok(None)
    }

    /// Hypervisor hostnames of the hosts with every trait marked `true` and none marked
    /// `false`, as the cloud tells now; `None` when this backend cannot tell (the hosts'
    /// extra capabilities answer).
    async fn hosts_with_traits(
        &self,
        _traits: &[(String, bool)],
    ) -> Result<Option<std::collections::HashSet<String>>, InventoryError> {
        Ok(None)
    }

    /// Checks a floating IP being registered against the cloud's network (Blazar: the
    /// network exists, a subnet holds the address, outside its allocation pools and not its
    /// gateway). Returns the subnet holding it; `None` when this backend cannot tell.
    async fn check_floatingip(
        &self,
        _network_id: &str,
        _address: std::net::IpAddr,
    ) -> Result<Option<String>, InventoryError> {
        Ok(None)
    }

    /// The health of the cloud's hosts, for the monitor: `None` when this backend cannot
    /// tell (standalone: an operator marks hosts by hand). The list is every host the cloud
    /// knows: an enrolled host missing from it is failed (unless the list is empty).
    async fn host_health(&self) -> Result<Option<Vec<HostHealth>>, InventoryError> {
        Ok(None)
    }

    /// Of `checks`, the floating IPs and network segments something outside blazar-rs holds
    /// in the cloud (an address held by another project's floating IP, a segment carrying
    /// another project's network), by resource id, each with what holds it. What blazar-rs
    /// made for a reservation, and what the project holding the resource now made on it, are
    /// not taken. `None` when this backend cannot tell.
    async fn pools_taken(
        &self,
        _checks: &[PoolCheck],
    ) -> Result<Option<std::collections::BTreeMap<i64, String>>, InventoryError> {
        Ok(None)
    }

    /// Compares the cloud with `desired` and repairs the differences (`apply`), or only
    /// lists them. Backends with nothing outside to compare report nothing.
    async fn reconcile(
        &self,
        _store: &Store,
        _desired: &crate::DesiredState,
        apply: bool,
    ) -> Result<crate::ReconcileReport, InventoryError> {
        Ok(crate::ReconcileReport {
            applied: apply,
            ..crate::ReconcileReport::default()
        })
    }

    /// Whether a new host reservation is prepared in the cloud as soon as it is made
    /// (`prepare`, and `release` if it is deleted before it starts), as Blazar creates the
    /// reservation's aggregate at reservation time.
    fn prepares_reservations(&self) -> bool {
        false
    }

    /// Whether enrolling and removing hosts acts on the cloud (then `enrol` and `withdraw`
    /// actions are recorded).
    fn acts_on_inventory(&self) -> bool {
        false
    }
}

/// For sites without OpenStack: hand-overs are records, visible through the API. It
/// answers the records to write instead of writing them itself: one write transaction per
/// action was what a burst of a thousand starts spent most of its time on.
pub struct StandaloneBackend;

#[async_trait]
impl Backend for StandaloneBackend {
    async fn apply(&self, _store: &Store, action: &Action) -> Result<ActionOutput, ActionError> {
        let mut handovers = Vec::new();
        for &resource_id in &action.resources {
            match action.kind {
                ActionKind::Start => handovers.push(HandoverChange::Start(Handover {
                    resource_type: action.resource_type.clone(),
                    resource_id,
                    project_id: action.project_id.clone(),
                    lease_id: action.lease_id.clone(),
                    reservation_id: action.reservation_id.clone(),
                    started_at: action.at,
                    ended_at: None,
                })),
                ActionKind::Stop => handovers.push(HandoverChange::End {
                    reservation_id: action.reservation_id.clone(),
                    resource_id,
                    at: action.at,
                }),
                // Nothing outside to change for the others.
                ActionKind::Enrol
                | ActionKind::Withdraw
                | ActionKind::Prepare
                | ActionKind::Release
                | ActionKind::Snapshot
                | ActionKind::OnEnd
                | ActionKind::DeleteTrust => {}
            }
        }
        for &resource_id in &action.resources {
            tracing::info!(
                lease.id = %action.lease_id,
                project.id = %action.project_id,
                resource.type = %action.resource_type,
                resource.id = resource_id,
                "{}",
                match action.kind {
                    ActionKind::Start => "resource handed over",
                    ActionKind::Stop => "resource taken back",
                    ActionKind::Enrol => "host enrolled",
                    ActionKind::Withdraw => "host withdrawn",
                    ActionKind::Prepare => "reservation prepared",
                    ActionKind::Release => "reservation released",
                    ActionKind::Snapshot => "snapshot requested",
                    ActionKind::OnEnd => "usage enforcement told",
                    ActionKind::DeleteTrust => "trust deleted",
                }
            );
        }
        Ok(ActionOutput {
            handovers,
            ..ActionOutput::default()
        })
    }
}
