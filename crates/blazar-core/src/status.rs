//! Lease, reservation and event statuses, with Blazar's wire spelling.

use std::fmt;
use std::str::FromStr;

macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),+ }

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
    /// Lease statuses. Only the stable ones are ever committed by blazar-rs: every transition
    /// happens inside one transaction, so the transitional states of Blazar are never visible.
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
