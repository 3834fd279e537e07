//! Refusals of lease creates and updates that say why in a form a program can read: beside
//! Blazar's message (unchanged, clients match on it), one [`Reason`] per thing at fault.

use blazar_core::engine::Usage;
use blazar_core::reservation::{Affinity, FlavorChoice};
use blazar_core::{ReservationSpec, TimeWindow};

use crate::ServiceError;

/// Which HTTP class a refusal belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    BadRequest,
    Forbidden,
    NotFound,
    Conflict,
}

/// A refused create or update: Blazar's message and why, item by item.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub kind: RefusalKind,
    pub message: String,
    pub reasons: Vec<Reason>,
    /// What to search for the next offer, when a reason has room for one; set where the
    /// refused request is at hand, used once its transaction is gone. Never sent.
    pub retry: Option<Box<Retry>>,
    /// Too few resources were free in the window asked for: another window may fit, so
    /// `earliest` and offers search on. Most such refusals are 409s; floating IPs answer
    /// Blazar's 400.
    pub shortfall: bool,
}

/// The request a refused create or update would have to move: every reservation of the
/// lease as it would have been, the window asked for, and the lease whose own allocations
/// do not count (an update's).
#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    pub specs: Vec<ReservationSpec>,
    pub window: TimeWindow,
    pub except_lease: Option<String>,
    /// The lease refused is one that has started (an update of it): it cannot move, so it
    /// gets no next offer. Judged by its status, not by the dates asked for: an update of a
    /// pending lease to start now asks for a start in the current minute.
    pub started: bool,
    /// Whose lease it is (user, project), for an update: the advice is for the lease's
    /// owner, whose quotas and filters the update is measured by, not for the caller (an
    /// admin updating a member's lease).
    pub owner: Option<(String, String)>,
}

/// The reservation a reason is about: its 1-based position in a create, its id in an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReservationRef {
    Position(usize),
    Id(String),
}

impl std::fmt::Display for ReservationRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReservationRef::Position(n) => write!(f, "{n}"),
            ReservationRef::Id(id) => f.write_str(id),
        }
    }
}

/// What a reservation asked for, in numbers; the fields its type has are set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requested {
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub amount: Option<u32>,
    pub vcpus: Option<i64>,
    pub memory_mb: Option<i64>,
    pub disk_gb: Option<i64>,
    /// `same`, `different` or `any` host for instances.
    pub affinity: Option<&'static str>,
    pub flavor: Option<String>,
    pub network_id: Option<String>,
    pub required_floatingips: Vec<String>,
}

impl Requested {
    /// What `spec` asks for.
    pub fn of(spec: &ReservationSpec) -> Requested {
        let size = |u: Usage| (Some(u.vcpus), Some(u.memory_mb), Some(u.disk_gb));
        match spec {
            ReservationSpec::Host(h) => Requested {
                min: Some(h.min),
                max: Some(h.max),
                ..Requested::default()
            },
            ReservationSpec::Instance(i) => {
                let (vcpus, memory_mb, disk_gb) = size(i.size);
                Requested {
                    amount: Some(i.amount),
                    vcpus,
                    memory_mb,
                    disk_gb,
                    affinity: Some(affinity(i.affinity)),
                    ..Requested::default()
                }
            }
            ReservationSpec::FlavorInstance(f) => {
                let (flavor, (vcpus, memory_mb, disk_gb)) = match &f.flavor {
                    FlavorChoice::Named(name) => (name.clone(), (None, None, None)),
                    FlavorChoice::Found(found) => (found.flavor.id.clone(), size(found.size)),
                };
                Requested {
                    amount: Some(f.amount),
                    vcpus,
                    memory_mb,
                    disk_gb,
                    affinity: Some(affinity(f.affinity)),
                    flavor: Some(flavor),
                    ..Requested::default()
                }
            }
            ReservationSpec::FloatingIp(f) => Requested {
                amount: Some(f.amount),
                network_id: Some(f.network_id.clone()),
                required_floatingips: f.required_floatingips.clone(),
                ..Requested::default()
            },
            ReservationSpec::Network(_) => Requested {
                amount: Some(1),
                ..Requested::default()
            },
            ReservationSpec::Device(d) => Requested {
                min: Some(d.min),
                max: Some(d.max),
                ..Requested::default()
            },
        }
    }
}

fn affinity(a: Affinity) -> &'static str {
    match a {
        Affinity::Same => "same",
        Affinity::Different => "different",
        Affinity::Any => "any",
    }
}

/// What the search found for a reservation it could not satisfy. Only told to callers who
/// may know (see `Service::may_explain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Availability {
    /// Resources that match the request and are reservable (hosts that fit one instance,
    /// for instance reservations; the required addresses, when those were at fault).
    pub matching: i64,
    /// Of them, how many are free over the window (free instance slots, for instances).
    pub free: i64,
    pub window: TimeWindow,
    /// The next window of the same length the request would fit in, once the offer search
    /// provides it; see `Service::finalise_refusal`.
    pub next_offer: Option<TimeWindow>,
}

/// One thing at fault in a refused create or update.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reason {
    pub reservation: Option<ReservationRef>,
    pub resource_type: Option<String>,
    pub requested: Option<Requested>,
    /// Counts and window; `None` when the caller may not be told them.
    pub availability: Option<Availability>,
    /// The policy rule that refused.
    pub rule: Option<String>,
    /// The request field at fault.
    pub field: Option<String>,
    /// The usage-enforcement filter that refused (`MaxLeaseDurationFilter`, ...).
    pub filter: Option<String>,
    /// The project quota exceeded: which, its limit, the use without the request and what
    /// the request adds.
    pub quota: Option<blazar_core::quota::QuotaExcess>,
}

impl Reason {
    pub fn rule(rule: &str) -> Reason {
        Reason {
            rule: Some(rule.to_string()),
            ..Reason::default()
        }
    }

    pub fn field(field: &str) -> Reason {
        Reason {
            field: Some(field.to_string()),
            ..Reason::default()
        }
    }

    /// A reservation that could not be satisfied; `availability` only when it may be told.
    pub fn shortfall(
        reservation: ReservationRef,
        resource_type: &str,
        availability: Option<Availability>,
    ) -> Reason {
        Reason {
            reservation: Some(reservation),
            resource_type: Some(resource_type.to_string()),
            availability,
            ..Reason::default()
        }
    }
}

impl ServiceError {
    /// A shortfall of `resource_type` with reasons: a 409, or Blazar's 400 for floating IPs.
    pub(crate) fn shortfall(
        resource_type: &str,
        message: impl Into<String>,
        reasons: Vec<Reason>,
    ) -> ServiceError {
        let kind = if resource_type == blazar_core::reservation::FLOATINGIP {
            RefusalKind::BadRequest
        } else {
            RefusalKind::Conflict
        };
        ServiceError::Refused(Box::new(Refused {
            kind,
            message: message.into(),
            reasons,
            retry: None,
            shortfall: true,
        }))
    }

    /// This error with `reason` added, if it is a refusal (4xx); others are left alone.
    pub(crate) fn with_reason(self, reason: Reason) -> ServiceError {
        match self.into_refused() {
            Ok(mut refused) => {
                refused.reasons.push(reason);
                ServiceError::Refused(refused)
            }
            Err(other) => other,
        }
    }

    /// A refusal (4xx) as a [`Refused`], with the reasons it has (perhaps none), so every
    /// refusal of a create or update carries a list; other errors stay as they are.
    pub(crate) fn explained(self) -> ServiceError {
        match self.into_refused() {
            Ok(refused) => ServiceError::Refused(refused),
            Err(other) => other,
        }
    }

    fn into_refused(self) -> Result<Box<Refused>, ServiceError> {
        let (kind, message) = match self {
            ServiceError::Refused(r) => return Ok(r),
            ServiceError::BadRequest(m) => (RefusalKind::BadRequest, m),
            ServiceError::Forbidden(m) => (RefusalKind::Forbidden, m),
            ServiceError::NotFound(m) => (RefusalKind::NotFound, m),
            ServiceError::Conflict(m) => (RefusalKind::Conflict, m),
            other => return Err(other),
        };
        Ok(Box::new(Refused {
            kind,
            message,
            reasons: Vec::new(),
            retry: None,
            shortfall: false,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_their_class_and_message_and_gain_reasons() {
        let cases = [
            (
                ServiceError::BadRequest("b".into()),
                RefusalKind::BadRequest,
            ),
            (ServiceError::Forbidden("f".into()), RefusalKind::Forbidden),
            (ServiceError::NotFound("n".into()), RefusalKind::NotFound),
            (ServiceError::Conflict("c".into()), RefusalKind::Conflict),
        ];
        for (error, kind) in cases {
            let message = error.to_string();
            let ServiceError::Refused(r) = error.with_reason(Reason::field("name")) else {
                panic!("not a refusal");
            };
            assert_eq!(r.kind, kind);
            assert_eq!(r.message, message);
            assert_eq!(r.reasons, vec![Reason::field("name")]);
        }
        assert_eq!(
            ServiceError::Internal("x".into()).with_reason(Reason::field("name")),
            ServiceError::Internal("x".into())
        );
        assert_eq!(
            ServiceError::Unavailable("x".into()).explained(),
            ServiceError::Unavailable("x".into())
        );
    }
}
