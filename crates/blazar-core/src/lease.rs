//! Leases, reservations, events and allocations, and the rules a lease change must obey.
//!
//! The rules are pure functions of the lease as stored, the request and the current minute:
//! [`plan_create`] and [`plan_update`] answer what the change does to the lease's window and
//! events, or why it is refused. The service carries a plan out in its transaction.

use chrono::{DateTime, Duration, Utc};

use crate::reservation::ReservationSpec;
use crate::status::{EventStatus, EventType, LeaseStatus, ReservationStatus};
use crate::time::TimeWindow;

/// A lease as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub id: String,
    pub name: String,
    pub user_id: String,
    pub project_id: String,
    pub trust_id: String,
    /// `trust_id` names a Keystone trust made for this lease (`act_for_user = trust`): the
    /// service acts for the user through it and deletes it with the lease. Otherwise it is
    /// an id of the same shape that names nothing.
    pub keystone_trust: bool,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub status: LeaseStatus,
    /// Some of its reservations lost resources that could not be replaced.
    pub degraded: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

/// One reservation of a lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    pub id: String,
    pub lease_id: String,
    /// Its place in the lease's request, from 0.
    pub ordinal: i64,
    /// Blazar's per-reservation resource id (the aggregate or pool it is handed over in).
    pub resource_id: String,
    pub status: ReservationStatus,
    pub missing_resources: bool,
    pub resources_changed: bool,
    /// What it asks for.
    pub spec: ReservationSpec,
    /// How many units (hosts, slots, addresses) it was granted.
    pub granted_units: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

impl Reservation {
    /// The `resource_type` of the API.
    pub fn resource_type(&self) -> &'static str {
        self.spec.resource_type()
    }
}

/// A lease event: its start, its end, or the notice before its end.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: String,
    pub lease_id: String,
    pub event_type: EventType,
    pub time: DateTime<Utc>,
    /// Order among events due at the same instant (ends before starts).
    pub rank: i64,
    pub status: EventStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

impl Event {
    /// A new event, not run yet.
    pub fn new(
        id: String,
        lease_id: &str,
        event_type: EventType,
        time: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Event {
        Event {
            id,
            lease_id: lease_id.to_string(),
            event_type,
            time,
            rank: event_type.same_time_rank(),
            status: EventStatus::Undone,
            created_at: now,
            updated_at: None,
        }
    }
}

/// What one reservation holds of one resource, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub id: String,
    pub reservation_id: String,
    pub lease_id: String,
    /// The inventory kind of the resource (`physical:host` for instance slots).
    pub resource_type: String,
    pub resource_id: i64,
    pub occupancy: Occupancy,
}

/// What an allocation holds of its resource, and when: the part that every form of an
/// allocation (stored, about to be written, on a timeline) shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Occupancy {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The end plus the cleaning margin: nobody else may have the resource before it.
    pub blocked_until: DateTime<Utc>,
    /// The whole resource (a host, an address), not a share of its capacity.
    pub exclusive: bool,
    /// For shared allocations: how many slots, and the size of one slot.
    pub units: i64,
    pub vcpus: i64,
    pub memory_mb: i64,
    pub disk_gb: i64,
}

impl Occupancy {
    /// What it uses of its resource's capacity for instances: `units` slots of its size
    /// (nothing is counted for a whole resource, whose slot size is zero).
    pub fn usage(&self) -> crate::engine::Usage {
        crate::engine::Usage {
            vcpus: self.vcpus,
            memory_mb: self.memory_mb,
            disk_gb: self.disk_gb,
        }
        .times(self.units)
    }

    /// The whole resource over `[start, end)`, blocked until `blocked_until`.
    pub fn whole(
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        blocked_until: DateTime<Utc>,
    ) -> Occupancy {
        Occupancy {
            start,
            end,
            blocked_until,
            exclusive: true,
            units: 1,
            vcpus: 0,
            memory_mb: 0,
            disk_gb: 0,
        }
    }
}

/// A lease with its reservations and events: everything the API shows about it.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseView {
    pub lease: Lease,
    pub reservations: Vec<Reservation>,
    pub events: Vec<Event>,
}

impl LeaseView {
    /// The earliest event not run yet.
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        self.events
            .iter()
            .filter(|e| e.status == EventStatus::Undone)
            .map(|e| e.time)
            .min()
    }
}

/// The status of the lease's event of `kind` (`Undone` when it has none).
pub fn event_status(events: &[Event], kind: EventType) -> EventStatus {
    events
        .iter()
        .find(|e| e.event_type == kind)
        .map_or(EventStatus::Undone, |e| e.status)
}

/// Why a change to a lease is refused; the message is for the user, in Blazar's words where
/// Blazar has them (clients and scripts match on them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request is wrong whatever the state (a 400).
    #[error("{0}")]
    Invalid(String),
    /// A date of the request is wrong whatever the state (a 400): `field` names it.
    #[error("{message}")]
    BadDate {
        field: &'static str,
        message: String,
    },
    /// The lease is in a state that does not allow it now (a 409).
    #[error("{0}")]
    Conflict(String),
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::Invalid(message.into())
}

fn bad_date(field: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::BadDate {
        field,
        message: message.into(),
    }
}

/// A date as requested: a minute, or `now` (the current minute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Now,
    At(DateTime<Utc>),
}

impl When {
    pub fn resolve(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            When::Now => now,
            When::At(t) => t,
        }
    }
}

fn minute(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

/// `before_end_date` must fall strictly inside the lease.
fn check_before_end(
    t: DateTime<Utc>,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Result<(), Refusal> {
    if t <= start || t >= end {
        return Err(bad_date(
            "before_end_date",
            format!(
                "before_end_date {} must be strictly between the start ({}) and end ({}) dates",
                minute(t),
                minute(start),
                minute(end)
            ),
        ));
    }
    Ok(())
}

/// The window and before-end notice of a new lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatePlan {
    pub window: TimeWindow,
    pub before_end: Option<DateTime<Utc>>,
}

/// Checks the dates of a new lease at minute `now`. `default_notice` is how long before the
/// end the before-end notice falls when the request names none (none when zero).
pub fn plan_create(
    start: When,
    end: When,
    before_end: Option<DateTime<Utc>>,
    default_notice: Duration,
    now: DateTime<Utc>,
) -> Result<CreatePlan, Refusal> {
    let start = start.resolve(now);
    if start < now {
        return Err(bad_date(
            "start_date",
            "Start date must be later than current date",
        ));
    }
    let end = end.resolve(now);
    let window = TimeWindow::new(start, end)
        .map_err(|_| bad_date("end_date", "End date must be later than start date."))?;
    let before_end = match before_end {
        Some(t) => {
            check_before_end(t, start, end)?;
            Some(t)
        }
        None => (default_notice > Duration::zero())
            .then(|| (window.end() - default_notice).max(window.start())),
    };
    Ok(CreatePlan { window, before_end })
}

/// What an update asks of a lease's dates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatesRequest {
    pub start: Option<When>,
    pub end: Option<When>,
    pub before_end: Option<DateTime<Utc>>,
    /// Whether reservations change too (an update that does not is a rename).
    pub changes_reservations: bool,
}

impl DatesRequest {
    fn is_rename(&self) -> bool {
        self.start.is_none()
            && self.end.is_none()
            && self.before_end.is_none()
            && !self.changes_reservations
    }
}

/// An event moved by an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventMove {
    /// Its index in the events given to [`plan_update`].
    pub index: usize,
    pub time: DateTime<Utc>,
    pub status: EventStatus,
}

/// What an update does to a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdatePlan {
    /// Only the name changes (allowed in every stable status).
    Rename,
    /// The window moves or reservations change.
    Reschedule {
        window: TimeWindow,
        /// Whether the start or the end moves (every reservation is then allocated again).
        window_changed: bool,
        moves: Vec<EventMove>,
        /// A before-end notice the lease did not have.
        new_before_end: Option<DateTime<Utc>>,
    },
}

/// Checks an update of `lease` (with its `events`) at minute `now`, and says how its events
/// move. A lease the cloud is being changed for cannot be changed; a terminated one can only
/// be renamed; a started one keeps its start; a new start is not in the past; the end is after
/// the start and not in the past; the before-end notice falls inside the lease.
pub fn plan_update(
    lease: &Lease,
    events: &[Event],
    request: &DatesRequest,
    now: DateTime<Utc>,
) -> Result<UpdatePlan, Refusal> {
    if matches!(
        lease.status,
        LeaseStatus::Starting | LeaseStatus::Terminating
    ) {
        let next = if lease.status == LeaseStatus::Starting {
            "ACTIVE"
        } else {
            "TERMINATED"
        };
        return Err(Refusal::Conflict(format!(
            "Lease {} is {}: the cloud is being changed for it; update it once it is {next}",
            lease.id, lease.status
        )));
    }
    if request.is_rename() {
        return Ok(UpdatePlan::Rename);
    }
    // Blazar's order of checks, so that a request with several faults gets its message.
    let started = event_status(events, EventType::StartLease) != EventStatus::Undone;
    let ended = event_status(events, EventType::EndLease) != EventStatus::Undone;
    let mut new_start = request.start.map_or(lease.start, |w| w.resolve(now));
    // The input format has no seconds: a start that names the minute of one that has them
    // (a `now` lease given a minute another lease ended early in) names that start.
    if matches!(request.start, Some(When::At(_)))
        && new_start < lease.start
        && new_start == crate::time::truncate_to_minute(lease.start)
    {
        new_start = lease.start;
    }
    if started && new_start != lease.start {
        return Err(bad_date(
            "start_date",
            "Cannot modify the start date of already started leases",
        ));
    }
    if !started && request.start.is_some() && new_start < now {
        return Err(bad_date(
            "start_date",
            "Start date must be later than current date",
        ));
    }
    if ended || lease.status == LeaseStatus::Terminated {
        return Err(invalid("Terminated leases can only be renamed"));
    }
    let new_end = request.end.map_or(lease.end, |w| w.resolve(now));
    // Blazar takes an end equal to the start: "end it now" in the first minute of a lease
    // that started. Here a lease lasts at least a second, so it ends one second in. (A lease
    // given a minute that another had ended early in starts within it, after the minute's
    // start that "now" names.)
    let new_end = if started && request.end.is_some() && new_end <= new_start && new_end >= now {
        new_start + chrono::Duration::seconds(1)
    } else {
        new_end
    };
    let window = match TimeWindow::new(new_start, new_end) {
        Ok(w) if new_end >= now => w,
        _ => {
            return Err(bad_date(
                "end_date",
                "End date must be later than current and start date",
            ));
        }
    };
    if let Some(t) = request.before_end {
        check_before_end(t, new_start, new_end)?;
    }

    // The events move with the lease; a before-end notice keeps its distance to the end
    // unless the request names it, and runs again if it moves into the future.
    let mut moves = Vec::new();
    let mut has_before_end = false;
    for (index, event) in events.iter().enumerate() {
        let time = match event.event_type {
            EventType::StartLease => new_start,
            EventType::EndLease => new_end,
            EventType::BeforeEndLease => {
                has_before_end = true;
                request
                    .before_end
                    .unwrap_or_else(|| new_end - (lease.end - event.time))
                    .max(new_start)
            }
        };
        if time == event.time {
            continue;
        }
        let status = if event.event_type == EventType::BeforeEndLease
            && event.status == EventStatus::Done
            && time > now
        {
            EventStatus::Undone
        } else {
            event.status
        };
        moves.push(EventMove {
            index,
            time,
            status,
        });
    }
    let new_before_end = match (request.before_end, has_before_end) {
        (Some(t), false) => Some(t),
        _ => None,
    };
    Ok(UpdatePlan::Reschedule {
        window,
        window_changed: new_start != lease.start || new_end != lease.end,
        moves,
        new_before_end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, h, m, 0).unwrap()
    }

    fn lease(status: LeaseStatus) -> Lease {
        Lease {
            id: "l1".into(),
            name: "demo".into(),
            user_id: "u".into(),
            project_id: "p".into(),
            trust_id: String::new(),
            keystone_trust: false,
            start: at(10, 0),
            end: at(12, 0),
            status,
            degraded: false,
            created_at: at(8, 0),
            updated_at: None,
        }
    }

    fn events(start: EventStatus, end: EventStatus, notice: Option<EventStatus>) -> Vec<Event> {
        let mut out = vec![
            Event {
                status: start,
                ..Event::new("s".into(), "l1", EventType::StartLease, at(10, 0), at(8, 0))
            },
            Event {
                status: end,
                ..Event::new("e".into(), "l1", EventType::EndLease, at(12, 0), at(8, 0))
            },
        ];
        if let Some(status) = notice {
            out.push(Event {
                status,
                ..Event::new(
                    "b".into(),
                    "l1",
                    EventType::BeforeEndLease,
                    at(11, 0),
                    at(8, 0),
                )
            });
        }
        out
    }

    fn dates(start: Option<When>, end: Option<When>) -> DatesRequest {
        DatesRequest {
            start,
            end,
            ..DatesRequest::default()
        }
    }

    /// name, status, events, request, now, the refusal's words.
    type Case = (
        &'static str,
        LeaseStatus,
        Vec<Event>,
        DatesRequest,
        DateTime<Utc>,
        &'static str,
    );

    #[test]
    fn update_refusals() {
        use EventStatus::{Done, Undone};
        use LeaseStatus::*;
        let cases: Vec<Case> = vec![
            (
                "starting",
                Starting,
                events(Undone, Undone, None),
                dates(None, None),
                at(9, 0),
                "update it once it is ACTIVE",
            ),
            (
                "terminating",
                Terminating,
                events(Done, Undone, None),
                dates(None, Some(When::At(at(13, 0)))),
                at(11, 0),
                "update it once it is TERMINATED",
            ),
            (
                "terminated",
                Terminated,
                events(Done, Done, None),
                dates(None, Some(When::At(at(13, 0)))),
                at(12, 30),
                "Terminated leases can only be renamed",
            ),
            (
                "terminated, new start",
                Terminated,
                events(Done, Done, None),
                dates(Some(When::At(at(13, 0))), None),
                at(12, 30),
                "Cannot modify the start date of already started leases",
            ),
            (
                "started, new start",
                Active,
                events(Done, Undone, None),
                dates(Some(When::At(at(10, 30))), None),
                at(10, 15),
                "Cannot modify the start date of already started leases",
            ),
            (
                "start in the past",
                Pending,
                events(Undone, Undone, None),
                dates(Some(When::At(at(8, 0))), None),
                at(9, 0),
                "Start date must be later than current date",
            ),
            (
                "end before start",
                Pending,
                events(Undone, Undone, None),
                dates(None, Some(When::At(at(9, 30)))),
                at(9, 0),
                "End date must be later than current and start date",
            ),
            (
                "end in the past",
                Active,
                events(Done, Undone, None),
                dates(None, Some(When::At(at(10, 30)))),
                at(11, 0),
                "End date must be later than current and start date",
            ),
            (
                "notice outside",
                Pending,
                events(Undone, Undone, None),
                DatesRequest {
                    before_end: Some(at(12, 0)),
                    ..DatesRequest::default()
                },
                at(9, 0),
                "must be strictly between",
            ),
        ];
        for (name, status, events, request, now, expected) in cases {
            let refusal = plan_update(&lease(status), &events, &request, now).unwrap_err();
            assert!(refusal.to_string().contains(expected), "{name}: {refusal}");
        }
    }

    #[test]
    fn a_terminated_lease_can_be_renamed() {
        let plan = plan_update(
            &lease(LeaseStatus::Terminated),
            &events(EventStatus::Done, EventStatus::Done, None),
            &DatesRequest::default(),
            at(13, 0),
        );
        assert_eq!(plan, Ok(UpdatePlan::Rename));
    }

    #[test]
    fn events_move_with_the_lease() {
        // The end moves two hours later: the notice keeps its hour before the end and runs
        // again although it ran already; the start stays.
        let plan = plan_update(
            &lease(LeaseStatus::Active),
            &events(
                EventStatus::Done,
                EventStatus::Undone,
                Some(EventStatus::Done),
            ),
            &dates(None, Some(When::At(at(14, 0)))),
            at(11, 30),
        )
        .unwrap();
        let UpdatePlan::Reschedule {
            window,
            window_changed,
            moves,
            new_before_end,
        } = plan
        else {
            panic!("{plan:?}");
        };
        assert_eq!((window.start(), window.end()), (at(10, 0), at(14, 0)));
        assert!(window_changed);
        assert_eq!(new_before_end, None);
        assert_eq!(
            moves,
            vec![
                EventMove {
                    index: 1,
                    time: at(14, 0),
                    status: EventStatus::Undone
                },
                EventMove {
                    index: 2,
                    time: at(13, 0),
                    status: EventStatus::Undone
                },
            ]
        );
    }

    #[test]
    fn a_start_named_by_its_minute_is_the_start_of_a_lease_that_began_within_it() {
        // A `now` lease that began after an early end in its minute starts at a second
        // the input format cannot write: its minute sent back with a new end is its start.
        let began = at(10, 0) + Duration::seconds(1);
        let started = Lease {
            start: began,
            ..lease(LeaseStatus::Active)
        };
        let running = events(EventStatus::Done, EventStatus::Undone, None);
        let plan = plan_update(
            &started,
            &running,
            &dates(Some(When::At(at(10, 0))), Some(When::At(at(13, 0)))),
            at(10, 30),
        )
        .unwrap();
        let UpdatePlan::Reschedule { window, .. } = plan else {
            panic!("{plan:?}");
        };
        assert_eq!((window.start(), window.end()), (began, at(13, 0)));
        // Any other minute is still a new start.
        let refusal = plan_update(
            &started,
            &running,
            &dates(Some(When::At(at(10, 1))), None),
            at(10, 30),
        )
        .unwrap_err();
        assert!(
            refusal.to_string().contains("Cannot modify the start date"),
            "{refusal}"
        );
    }

    #[test]
    fn a_notice_is_added_when_the_lease_had_none() {
        let plan = plan_update(
            &lease(LeaseStatus::Pending),
            &events(EventStatus::Undone, EventStatus::Undone, None),
            &DatesRequest {
                before_end: Some(at(11, 30)),
                ..DatesRequest::default()
            },
            at(9, 0),
        )
        .unwrap();
        assert!(matches!(
            plan,
            UpdatePlan::Reschedule { window_changed: false, new_before_end: Some(t), ref moves, .. }
                if t == at(11, 30) && moves.is_empty()
        ));
    }

    #[test]
    fn create_dates() {
        let now = at(9, 0);
        let notice = Duration::minutes(30);
        let plan = plan_create(When::Now, When::At(at(10, 0)), None, notice, now).unwrap();
        assert_eq!(plan.window.start(), now);
        assert_eq!(plan.before_end, Some(at(9, 30)));
        // A notice longer than the lease falls at its start.
        let plan = plan_create(When::Now, When::At(at(9, 10)), None, notice, now).unwrap();
        assert_eq!(plan.before_end, Some(now));
        let none = plan_create(When::Now, When::At(at(10, 0)), None, Duration::zero(), now);
        assert_eq!(none.unwrap().before_end, None);
        let refusals = [
            (
                When::At(at(8, 59)),
                When::At(at(10, 0)),
                None,
                "Start date must be later",
            ),
            (
                When::Now,
                When::Now,
                None,
                "End date must be later than start date.",
            ),
            (
                When::Now,
                When::At(at(10, 0)),
                Some(at(10, 0)),
                "must be strictly between",
            ),
        ];
        let fields = ["start_date", "end_date", "before_end_date"];
        for ((start, end, before_end, expected), field) in refusals.into_iter().zip(fields) {
            let refusal = plan_create(start, end, before_end, notice, now).unwrap_err();
            assert!(refusal.to_string().contains(expected), "{refusal}");
            assert!(
                matches!(refusal, Refusal::BadDate { field: f, .. } if f == field),
                "{refusal:?} should name {field}"
            );
        }
    }
}
