//! Time windows: UTC, minute granularity on input, half-open `[start, end)`.

use chrono::{DateTime, Duration, DurationRound, Utc};

/// A half-open interval `[start, end)` with `start < end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimeWindow {
    start: DateTime<Utc>,
    end: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("the end date must be later than the start date")]
    EndNotAfterStart,
}

impl TimeWindow {
    pub fn new(start: DateTime<Utc>, end: DateTime<Utc>) -> Result<Self, WindowError> {
        if end <= start {
            return Err(WindowError::EndNotAfterStart);
        }
        Ok(Self { start, end })
    }

    pub fn start(&self) -> DateTime<Utc> {
        self.start
    }

    pub fn end(&self) -> DateTime<Utc> {
        self.end
    }

    /// Two half-open windows overlap when each starts before the other ends, so back-to-back
    /// windows (`a.end == b.start`) do not overlap.
    pub fn overlaps(&self, other: &TimeWindow) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// The window a resource stays blocked for: the lease window followed by the cleaning
    /// margin, during which nobody else may use the resource.
    pub fn blocked(&self, cleaning: Duration) -> TimeWindow {
        TimeWindow {
            start: self.start,
            end: self.end + cleaning.max(Duration::zero()),
        }
    }
}

/// Truncates to the minute, the granularity of every user-supplied date.
pub fn truncate_to_minute(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(Duration::minutes(1)).unwrap_or(t)
}

/// The first whole minute at or after `t`: the earliest start a create made a moment later
/// still takes (a create refuses a start before its own current minute).
pub fn first_whole_minute(t: DateTime<Utc>) -> DateTime<Utc> {
    let floor = truncate_to_minute(t);
    if floor == t {
        t
    } else {
        floor + Duration::minutes(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_first_whole_minute_is_the_minute_itself_or_the_next() {
        let at = |m, s, ns| {
            Utc.with_ymd_and_hms(2030, 1, 1, 10, m, s).unwrap() + Duration::nanoseconds(ns)
        };
        assert_eq!(first_whole_minute(at(32, 0, 0)), at(32, 0, 0));
        assert_eq!(first_whole_minute(at(32, 0, 1)), at(33, 0, 0));
        assert_eq!(first_whole_minute(at(32, 58, 0)), at(33, 0, 0));
        assert_eq!(
            first_whole_minute(at(59, 59, 0)),
            Utc.with_ymd_and_hms(2030, 1, 1, 11, 0, 0).unwrap()
        );
    }

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, h, m, 0).unwrap()
    }

    #[test]
    fn overlap_table() {
        let cases = [
            ((10, 12), (12, 14), false),
            ((10, 12), (11, 13), true),
            ((10, 12), (8, 10), false),
            ((10, 12), (9, 11), true),
            ((10, 12), (10, 12), true),
            ((10, 12), (10, 11), true),
        ];
        for ((a0, a1), (b0, b1), expected) in cases {
            let a = TimeWindow::new(at(a0, 0), at(a1, 0)).unwrap();
            let b = TimeWindow::new(at(b0, 0), at(b1, 0)).unwrap();
            assert_eq!(a.overlaps(&b), expected, "{a0}-{a1} vs {b0}-{b1}");
            assert_eq!(b.overlaps(&a), expected, "symmetry {a0}-{a1} vs {b0}-{b1}");
        }
    }

    #[test]
    fn empty_or_reversed_windows_are_refused() {
        assert!(TimeWindow::new(at(10, 0), at(10, 0)).is_err());
        assert!(TimeWindow::new(at(11, 0), at(10, 0)).is_err());
    }

    #[test]
    fn cleaning_margin_separates_back_to_back_windows() {
        let a = TimeWindow::new(at(10, 0), at(12, 0)).unwrap();
        let b = TimeWindow::new(at(12, 0), at(13, 0)).unwrap();
        assert!(!a.blocked(Duration::zero()).overlaps(&b));
        assert!(a.blocked(Duration::minutes(30)).overlaps(&b));
    }

    #[test]
    fn truncation_drops_seconds() {
        let t = Utc.with_ymd_and_hms(2030, 1, 1, 10, 5, 59).unwrap();
        assert_eq!(truncate_to_minute(t), at(10, 5));
    }
}
