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
    if !four_digit_year(text) {
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

/// The two formats above, digits written by hand: lists print a dozen dates per lease and
/// hundreds of thousands per allocation list, and both chrono's `format` (which re-reads
/// its pattern) and `write!` (a formatter call and a UTC-to-local step per field) were most
/// of a list's rendering cost.
fn format_fixed(t: DateTime<Utc>, separator: char, micros: bool) -> String {
    let naive = t.naive_utc();
    let mut out = String::with_capacity(26);
    match u32::try_from(naive.year()) {
        Ok(year) if year <= 9999 => push_digits(&mut out, year, 4),
        // Outside what Blazar's format knows; chrono's own digits, sign included.
        _ => out.push_str(&format!("{:04}", naive.year())),
    }
    out.push('-');
    push_digits(&mut out, naive.month(), 2);
    out.push('-');
    push_digits(&mut out, naive.day(), 2);
    out.push(separator);
    push_digits(&mut out, naive.hour(), 2);
    out.push(':');
    push_digits(&mut out, naive.minute(), 2);
    out.push(':');
    push_digits(&mut out, naive.second(), 2);
    if micros {
        out.push('.');
        // A leap second's nanoseconds run past 999,999,999: it prints as Blazar's would.
        push_digits(&mut out, (naive.nanosecond() / 1_000).min(999_999), 6);
    }
    out
}

/// Appends `value` as exactly `width` decimal digits, zero-padded (`value` < 10^width).
fn push_digits(out: &mut String, value: u32, width: u32) {
    for place in (0..width).rev() {
        let digit = (value / 10u32.pow(place)) % 10;
        out.push(char::from(b'0' + digit as u8));
    }
}

/// Parses what [`format_t`] prints (the client reads lease dates back this way).
pub fn parse_t(text: &str) -> Option<DateTime<Utc>> {
    if !four_digit_year(text) {
        return None;
    }
    NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .filter(|naive| (1..=9999).contains(&naive.year()))
        // chrono reads a second of 60 as a leap second (a nanosecond count past one second),
        // which UTC time stamps here never hold: it would start a window a second short of
        // the next minute.
        .filter(|naive| naive.nanosecond() < 1_000_000_000)
        .map(|naive| naive.and_utc())
}

/// Whether `text` starts with a year of exactly four digits and a dash: chrono's `%Y` would
/// take a sign and any number of digits, the wire's years have four.
fn four_digit_year(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() >= 5 && bytes[..4].iter().all(u8::is_ascii_digit) && bytes[4] == b'-'
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
        for outside in [
            "-0001-01-01T00:00:00",
            "+20000-01-01T00:00:00",
            "0000-01-01T00:00:00",
            "+2030-01-01T00:00:00",
            "02030-01-01T00:00:00",
            // A leap second: no UTC time stamp here holds one.
            "2031-05-01T10:00:60.000000",
            "2016-12-31T23:59:60",
        ] {
            assert_eq!(parse_t(outside), None, "{outside}");
        }
        let precise = Utc.with_ymd_and_hms(987, 12, 31, 23, 59, 7).unwrap()
            + chrono::Duration::microseconds(4_321);
        assert_eq!(format_t(precise), "0987-12-31T23:59:07.004321");
        assert_eq!(format_space(precise), "0987-12-31 23:59:07.004321");
        assert_eq!(
            format_t(precise),
            precise.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
        );
    }

    #[test]
    fn output_formats_agree_with_chrono_over_the_calendar() {
        // Seconds and microseconds from year 1 to 9999, by a step that visits every field.
        let first = Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap();
        let last = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap();
        let mut t = first;
        while t <= last {
            assert_eq!(format_t(t), t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string());
            let space = if t.timestamp_subsec_micros() == 0 {
                t.format("%Y-%m-%d %H:%M:%S").to_string()
            } else {
                t.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
            };
            assert_eq!(format_space(t), space);
            t += chrono::Duration::seconds(86_400 * 37 + 3_661)
                + chrono::Duration::microseconds(7_919);
        }
    }
}
