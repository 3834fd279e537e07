//! Blazar's date formats: input `YYYY-MM-DD HH:MM` or `now`; lease dates and event times out
//! as `%Y-%m-%dT%H:%M:%S.%f`; `created_at`/`updated_at` out as `YYYY-MM-DD HH:MM:SS`.

use chrono::{DateTime, Datelike, NaiveDateTime, Timelike, Utc};

pub const INPUT_FORMAT: &str = "%Y-%m-%d %H:%M";

/// A date as a user sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputDate {
    Now,
    At(DateTime<Utc>),
}

/// Parses `YYYY-MM-DD HH:MM` or `now`. Returns `None` for anything else, seconds included, as
/// Blazar's `strptime` does.
pub fn parse_input(text: &str) -> Option<InputDate> {
    if text == "now" {
        return Some(InputDate::Now);
    }
    parse_minute(text).map(InputDate::At)
}

/// Parses `YYYY-MM-DD HH:MM` only, with a year of exactly four digits from 0001 to 9999, as
/// Python's `strptime` (chrono alone would take a sign and any number of digits, and a lease
/// ending in year 262142 breaks every Python client that lists leases).
pub fn parse_minute(text: &str) -> Option<DateTime<Utc>> {
    let bytes = text.as_bytes();
    if bytes.len() < 5 || !bytes[..4].iter().all(u8::is_ascii_digit) || bytes[4] != b'-' {
        return None;
    }
    NaiveDateTime::parse_from_str(text, INPUT_FORMAT)
        .ok()
        .filter(|naive| (1..=9999).contains(&naive.year()))
        .map(|naive| naive.and_utc())
}

/// `2030-01-01T10:00:00.000000`: lease dates, event times, allocation dates.
pub fn format_t(t: DateTime<Utc>) -> String {
    format_fixed(t, 'T', true)
}

/// `2030-01-01 10:00:00`: `created_at` and `updated_at`.
pub fn format_space(t: DateTime<Utc>) -> String {
    format_fixed(t, ' ', t.timestamp_subsec_micros() != 0)
}

/// The two formats above with plain integer formatting: lists print a dozen dates per lease
/// and tens of thousands per allocation list, and chrono's `format` re-reads its pattern
/// every time (the larger part of a list's rendering cost).
fn format_fixed(t: DateTime<Utc>, separator: char, micros: bool) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(26);
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{:04}-{:02}-{:02}{separator}{:02}:{:02}:{:02}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    );
    if micros {
        let _ = write!(out, ".{:06}", t.timestamp_subsec_micros());
    }
    out
}

/// Parses what [`format_t`] prints (the client reads lease dates back this way).
pub fn parse_t(text: &str) -> Option<DateTime<Utc>> {
    NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|naive| naive.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn input_formats() {
        let t = Utc.with_ymd_and_hms(2030, 1, 1, 10, 5, 0).unwrap();
        assert_eq!(parse_input("2030-01-01 10:05"), Some(InputDate::At(t)));
        assert_eq!(parse_input("now"), Some(InputDate::Now));
        let last = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 0).unwrap();
        assert_eq!(parse_input("9999-12-31 23:59"), Some(InputDate::At(last)));
        let first = Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(parse_input("0001-01-01 00:00"), Some(InputDate::At(first)));
        for bad in [
            "2030-01-01 10:05:00",
            "2030-01-01T10:05",
            "tomorrow",
            "",
            "2030-13-01 10:00",
            "+262142-12-31 23:59",
            "262142-12-31 23:59",
            "10000-01-01 00:00",
            "-2030-01-01 10:00",
            "0000-01-01 00:00",
            "+2030-01-01 10:00",
            " 2030-01-01 10:00",
        ] {
            assert_eq!(parse_input(bad), None, "{bad}");
        }
    }

    #[test]
    fn output_formats() {
        let t = Utc.with_ymd_and_hms(2030, 1, 1, 10, 5, 0).unwrap();
        assert_eq!(format_t(t), "2030-01-01T10:05:00.000000");
        assert_eq!(format_space(t), "2030-01-01 10:05:00");
        assert_eq!(parse_t(&format_t(t)), Some(t));
        let precise = Utc.with_ymd_and_hms(987, 12, 31, 23, 59, 7).unwrap()
            + chrono::Duration::microseconds(4_321);
        assert_eq!(format_t(precise), "0987-12-31T23:59:07.004321");
        assert_eq!(format_space(precise), "0987-12-31 23:59:07.004321");
        assert_eq!(
            format_t(precise),
            precise.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
        );
    }
}
