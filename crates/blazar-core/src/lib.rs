//! The pure domain of blazar-rs: time windows, lease and event status machines, reservation
//! specs, the property query language and the allocation engine. Nothing here does I/O.

pub mod engine;
pub mod host;
pub mod lease;
pub mod offer;
pub mod query;
pub mod quota;
pub mod records;
pub mod request;
pub mod reservation;
pub mod status;
pub mod time;
pub mod timeline;

pub use host::{HostFacts, HostRecord};
pub use lease::{Allocation, Event, Lease, LeaseView, Occupancy, Refusal, Reservation, When};
pub use query::{PropertyQuery, QueryError};
pub use records::{
    ActionFilter, ActionIntent, ActionRecord, ApiToken, Flavor, Handover, HandoverFilter,
    HandoverPlace, IcalFeed, LeaseFilter, ListedHandover, Notification, Property, Resource,
    ResourceRecord, SequencedNotification, Webhook, WebhookDelivery,
};
pub use request::{ReservationChange, ReservationRequest};
pub use reservation::{MadeIds, ReservationSpec, SpecError};
pub use status::{
    ACTION_LOST_ATTEMPTS, ActionKind, ActionPurpose, ActionStatus, EventStatus, EventType,
    LeaseStatus, ReservationStatus, action_backoff,
};
pub use time::{TimeWindow, WindowError};
pub use timeline::{BusyInterval, Holder, Holding, ResourceTimeline};

/// The resource type string Blazar uses for whole-host reservations.
pub const PHYSICAL_HOST: &str = "physical:host";

/// What a webhook attempt that got no answer within its timeout records as its result. The
/// deliverer reads it back: an endpoint whose last attempt got no answer is sent one
/// delivery at a time until it answers again.
pub const WEBHOOK_NO_ANSWER: &str = "no answer in time";
