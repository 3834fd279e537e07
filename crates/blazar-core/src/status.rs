//! Lease, reservation and event statuses, with Blazar's wire spelling.

use std::fmt;
use std::str::FromStr;

macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownStatus;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(UnknownStatus(other.to_string())),
                }
            }
        }
    };
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?}")]
pub struct UnknownStatus(pub String);

wire_enum!(
    /// Lease statuses. blazar-rs commits the stable ones and two transitional ones: `STARTING`
    /// while the outside-world actions of a lease start are carried out, `TERMINATING` while
    /// those of its end are.
    LeaseStatus {
        Pending => "PENDING",
        Active => "ACTIVE",
        Terminated => "TERMINATED",
        Error => "ERROR",
        Creating => "CREATING",
        Starting => "STARTING",
        Updating => "UPDATING",
        Terminating => "TERMINATING",
        Deleting => "DELETING",
    }
);

wire_enum!(
    ReservationStatus {
        Pending => "pending",
        Active => "active",
        Deleted => "deleted",
        Error => "error",
    }
);

wire_enum!(
    /// What an outside-world action does to the resources it names.
    ActionKind {
        /// Hand the resources over to the reservation's project.
        Start => "start",
        /// Take them back.
        Stop => "stop",
        /// Put a newly enrolled host where the cloud keeps reservable hosts (the freepool).
        Enrol => "enrol",
        /// Take a host the inventory no longer holds out of there.
        Withdraw => "withdraw",
        /// Make what a new reservation will be handed over into (Blazar's aggregate).
        Prepare => "prepare",
        /// Undo a `prepare` of a reservation that never started.
        Release => "release",
        /// Snapshot what runs on the resources before the lease ends (`before_end: snapshot`).
        Snapshot => "snapshot",
        /// Tell the usage-enforcement filters that the lease ended (Blazar's `on_end`); no
        /// resource and no backend is involved.
        OnEnd => "on_end",
        /// Delete the Keystone trust made for a deleted lease (`act_for_user = trust`), after
        /// the lease's other actions, which may need it; no resource and no backend is
        /// involved.
        DeleteTrust => "delete_trust",
    }
);

wire_enum!(
    /// Why an action was recorded: what its completion moves on.
    ActionPurpose {
        /// The start of the lease: the lease is `ACTIVE` once all of these are done.
        LeaseStart => "lease_start",
        /// The end of the lease: `TERMINATED` once all of these are done.
        LeaseEnd => "lease_end",
        /// A change to a live reservation: an update, healing, a re-allocation.
        Change => "change",
        /// The lease was deleted: nothing to move on, only resources to take back.
        Delete => "delete",
        /// A change to the inventory (enrolment, removal): no lease.
        Inventory => "inventory",
        /// A new reservation: its lease moves on without waiting for it.
        Reserve => "reserve",
        /// The lease is about to end.
        BeforeEnd => "before_end",
        /// Usage enforcement was told of the lease: nothing waits for it.
        Enforcement => "enforcement",
    }
);

wire_enum!(
    /// Where an action stands. `pending` and `running` are open: later actions of the same
    /// lease or on the same resources wait for them.
    ActionStatus {
        Pending => "pending",
        Running => "running",
        Done => "done",
        Failed => "failed",
        Cancelled => "cancelled",
    }
);

impl ActionStatus {
    pub fn is_open(self) -> bool {
        matches!(self, ActionStatus::Pending | ActionStatus::Running)
    }
}

/// How long an action waits before its next attempt after `attempts` transient failures:
/// doubling from 2 s, capped at 30 s. The cap is short because retries are bounded by time
/// (`Settings::action_retry_for`), not by their number: a start or an end then goes on
/// within 30 s of the service it waited for coming back, however long that took.
pub fn action_backoff(attempts: u32) -> chrono::Duration {
    let seconds = 2i64.saturating_pow(attempts.clamp(1, 20)).min(30);
    chrono::Duration::seconds(seconds)
}

/// Attempts of one action that may end without reporting back (their worker stopped or
/// hung) before it fails for good: an action that takes its worker down would otherwise be
/// taken again for its whole retry span, taking a process down each time. Five, not fewer:
/// a rolling restart that kills each replica mid-attempt (one hanging on a cloud that does
/// not answer) loses an attempt per replica, through no fault of the action.
pub const ACTION_LOST_ATTEMPTS: i64 = 5;

wire_enum!(
    EventType {
        StartLease => "start_lease",
        EndLease => "end_lease",
        BeforeEndLease => "before_end_lease",
    }
);

wire_enum!(
    EventStatus {
        Undone => "UNDONE",
        InProgress => "IN_PROGRESS",
        Done => "DONE",
        Error => "ERROR",
    }
);

impl EventType {
    /// Order among events due at the same instant: ends first, so that back-to-back leases
    /// hand a resource over end-before-start; a lease's before-end notice after its start.
    pub fn same_time_rank(self) -> i64 {
        match self {
            EventType::EndLease => 0,
            EventType::StartLease => 1,
            EventType::BeforeEndLease => 2,
        }
    }
}

impl LeaseStatus {
    pub fn is_stable(self) -> bool {
        matches!(
            self,
            LeaseStatus::Pending
                | LeaseStatus::Active
                | LeaseStatus::Terminated
                | LeaseStatus::Error
        )
    }

    /// Whether a lease in this status may still become `target`: not once it is in `ERROR`
    /// (unless that is the target) or past the target in a lease's life (`TERMINATED` when
    /// waiting for `ACTIVE`). Transient statuses that can lead anywhere (`UPDATING`,
    /// `DELETING`) keep every target open.
    pub fn can_still_become(self, target: LeaseStatus) -> bool {
        fn rank(status: LeaseStatus) -> Option<u8> {
            match status {
                LeaseStatus::Creating => Some(0),
                LeaseStatus::Pending => Some(1),
                LeaseStatus::Starting => Some(2),
                LeaseStatus::Active => Some(3),
                LeaseStatus::Terminating => Some(4),
                LeaseStatus::Terminated => Some(5),
                _ => None,
            }
        }
        if self == target {
            return true;
        }
        if self == LeaseStatus::Error {
            return false;
        }
        match (rank(self), rank(target)) {
            (Some(now), Some(wanted)) => now < wanted,
            _ => true,
        }
    }

    /// The stable status implied by the statuses of the start and end events, as Blazar derives
    /// it after every operation.
    pub fn derive(start: EventStatus, end: EventStatus) -> LeaseStatus {
        match (start, end) {
            (EventStatus::Undone, EventStatus::Undone) => LeaseStatus::Pending,
            (EventStatus::Done, EventStatus::Undone) => LeaseStatus::Active,
            (EventStatus::Done, EventStatus::Done) => LeaseStatus::Terminated,
            _ => LeaseStatus::Error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reachable_statuses() {
        use LeaseStatus::*;
        let cases = [
            (Pending, Active, true),
            (Starting, Active, true),
            (Active, Active, true),
            (Updating, Active, true),
            (Error, Active, false),
            (Error, Error, true),
            (Terminating, Active, false),
            (Terminated, Active, false),
            (Active, Terminated, true),
            (Active, Pending, false),
            (Pending, Error, true),
        ];
        for (now, target, expected) in cases {
            assert_eq!(
                now.can_still_become(target),
                expected,
                "{now:?} -> {target:?}"
            );
        }
    }

    #[test]
    fn wire_names_round_trip() {
        for s in LeaseStatus::ALL {
            assert_eq!(s.as_str().parse::<LeaseStatus>().unwrap(), *s);
        }
        for s in EventType::ALL {
            assert_eq!(s.as_str().parse::<EventType>().unwrap(), *s);
        }
        assert!("pending".parse::<LeaseStatus>().is_err());
    }

    #[test]
    fn action_backoff_doubles_then_caps() {
        assert_eq!(action_backoff(1).num_seconds(), 2);
        assert_eq!(action_backoff(2).num_seconds(), 4);
        assert_eq!(action_backoff(4).num_seconds(), 16);
        assert_eq!(action_backoff(5).num_seconds(), 30);
        assert_eq!(action_backoff(u32::MAX).num_seconds(), 30);
        assert!(ActionStatus::Running.is_open() && !ActionStatus::Failed.is_open());
        for k in ActionKind::ALL {
            assert_eq!(k.as_str().parse::<ActionKind>().unwrap(), *k);
        }
    }

    #[test]
    fn derived_status_table() {
        use EventStatus::*;
        let cases = [
            (Undone, Undone, LeaseStatus::Pending),
            (Done, Undone, LeaseStatus::Active),
            (Done, Done, LeaseStatus::Terminated),
            (Error, Undone, LeaseStatus::Error),
            (Done, Error, LeaseStatus::Error),
            (InProgress, Undone, LeaseStatus::Error),
        ];
        for (start, end, expected) in cases {
            assert_eq!(LeaseStatus::derive(start, end), expected, "{start}/{end}");
        }
    }

    #[test]
    fn ends_run_before_starts_at_the_same_instant() {
        assert!(EventType::EndLease.same_time_rank() < EventType::StartLease.same_time_rank());
        assert!(
            EventType::StartLease.same_time_rank() < EventType::BeforeEndLease.same_time_rank()
        );
    }
}
