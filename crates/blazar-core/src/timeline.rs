//! Occupancy timelines: which resources are held when, over a window a calendar shows. The
//! window rule is here; the service fills the timeline in.

use chrono::{DateTime, Duration, Utc};

use crate::engine::Usage;
use crate::lease::When;
use crate::status::LeaseStatus;
use crate::time::{TimeWindow, truncate_to_minute};

/// How far a timeline reaches when no end is given.
pub const DEFAULT_SPAN_DAYS: i64 = 7;
/// The longest window one timeline may show: a year, leap day included. Longer ones would
/// read a resource type's whole history.
pub const MAX_SPAN_DAYS: i64 = 366;

/// The window of a timeline: from `start` (now when absent) to `end` (a week later when
/// absent). The end must come after the start, at most [`MAX_SPAN_DAYS`] later.
pub fn timeline_window(
    now: DateTime<Utc>,
    start: Option<When>,
    end: Option<When>,
) -> Result<TimeWindow, String> {
    let now = truncate_to_minute(now);
    let start = start.map_or(now, |w| w.resolve(now));
    let end = match end {
        Some(w) => w.resolve(now),
        // Not past the last minute Blazar's date formats can write (a five-digit year).
        None if start >= last_writable_minute() => {
            return Err(format!(
                "the start date {} leaves no room for a timeline: it must be before {}",
                start.format("%Y-%m-%d %H:%M"),
                last_writable_minute().format("%Y-%m-%d %H:%M")
            ));
        }
        None => start
            .checked_add_signed(Duration::days(DEFAULT_SPAN_DAYS))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
            .min(last_writable_minute()),
    };
    let window = TimeWindow::new(start, end).map_err(|e| e.to_string())?;
    if end - start > Duration::days(MAX_SPAN_DAYS) {
        return Err(format!(
            "the window of a timeline is at most {MAX_SPAN_DAYS} days long"
        ));
    }
    Ok(window)
}

/// The last minute Blazar's date formats can write: 9999-12-31 23:59.
fn last_writable_minute() -> DateTime<Utc> {
    chrono::NaiveDate::from_ymd_opt(9999, 12, 31)
        .and_then(|d| d.and_hms_opt(23, 59, 0))
        .map_or(DateTime::<Utc>::MAX_UTC, |t| t.and_utc())
}

/// What an allocation holds of its resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// The whole resource (a host, an address, a segment, a device).
    Whole,
    /// `units` instance slots of `size` each, sharing a host.
    Slots { units: i64, size: Usage },
}

/// Who holds an interval: shown only to those who may know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub lease_id: String,
    pub lease_name: String,
    pub project_id: String,
    pub reservation_id: String,
}

/// One allocation of a resource that overlaps the window, with its own dates (not clipped
/// to the window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyInterval {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The end of the cleaning margin after `end`; equal to `end` without one.
    pub blocked_until: DateTime<Utc>,
    pub status: LeaseStatus,
    pub degraded: bool,
    /// Whether the lease belongs to the caller's project.
    pub own: bool,
    /// `None` when the caller may not know whose lease it is.
    pub holder: Option<Holder>,
    pub holding: Holding,
}

/// One resource over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceTimeline {
    /// The id the API shows.
    pub id: String,
    pub name: String,
    /// Whether it may be reserved now; one that may not is in maintenance.
    pub reservable: bool,
    /// For hosts: how much instances may use of it (totals times allocation ratios).
    pub instance_capacity: Option<Usage>,
    /// In start order.
    pub busy: Vec<BusyInterval>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(day: u32, hour: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, day, hour, 0, 0).unwrap()
    }

    #[test]
    fn windows() {
        let now = at(1, 10) + Duration::seconds(42);
        type Row = (
            Option<When>,
            Option<When>,
            Result<(DateTime<Utc>, DateTime<Utc>), ()>,
        );
        let rows: &[Row] = &[
            (None, None, Ok((at(1, 10), at(8, 10)))),
            (Some(When::At(at(3, 0))), None, Ok((at(3, 0), at(10, 0)))),
            (None, Some(When::At(at(2, 0))), Ok((at(1, 10), at(2, 0)))),
            (
                Some(When::Now),
                Some(When::At(at(1, 11))),
                Ok((at(1, 10), at(1, 11))),
            ),
            (Some(When::At(at(2, 0))), Some(When::At(at(2, 0))), Err(())),
            (Some(When::At(at(3, 0))), Some(When::At(at(2, 0))), Err(())),
            (None, Some(When::At(at(1, 9))), Err(())),
            (
                Some(When::At(at(1, 0))),
                Some(When::At(at(1, 0) + Duration::days(366))),
                Ok((at(1, 0), at(1, 0) + Duration::days(366))),
            ),
            (
                Some(When::At(at(1, 0))),
                Some(When::At(
                    at(1, 0) + Duration::days(366) + Duration::minutes(1),
                )),
                Err(()),
            ),
            // The default week stops at the last minute the wire can write.
            (
                Some(When::At(last_writable_minute() - Duration::days(2))),
                None,
                Ok((
                    last_writable_minute() - Duration::days(2),
                    last_writable_minute(),
                )),
            ),
            (Some(When::At(last_writable_minute())), None, Err(())),
        ];
        for (start, end, expected) in rows {
            let got = timeline_window(now, *start, *end)
                .map(|w| (w.start(), w.end()))
                .map_err(|_| ());
            assert_eq!(&got, expected, "{start:?} {end:?}");
        }
        let long = timeline_window(
            now,
            Some(When::At(at(1, 0))),
            Some(When::At(at(1, 0) + Duration::days(400))),
        )
        .unwrap_err();
        assert_eq!(long, "the window of a timeline is at most 366 days long");
        let late = timeline_window(now, Some(When::At(last_writable_minute())), None).unwrap_err();
        assert_eq!(
            late,
            "the start date 9999-12-31 23:59 leaves no room for a timeline: it must be before \
             9999-12-31 23:59"
        );
    }
}
