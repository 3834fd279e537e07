//! Dates and durations as people type them (`now+1h`, `2026-12-01 18:00`, `1h30m`), turned
//! into what Blazar accepts: UTC, minute precision, `YYYY-MM-DD HH:MM` or `now`.

use chrono::{DateTime, Local, NaiveDateTime, TimeDelta, TimeZone, Timelike, Utc};

/// A date to send: `now` (the server's clock decides) or an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DateInput {
    Now,
    At(DateTime<Utc>),
}

impl DateInput {
    /// The instant, reading `now` as `now`.
    pub fn instant(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            DateInput::Now => now,
            DateInput::At(t) => t,
        }
    }

    /// Blazar's input format.
    pub fn to_wire(self) -> String {
        match self {
            DateInput::Now => "now".to_string(),
            DateInput::At(t) => format_minute(t),
        }
    }
}

/// `YYYY-MM-DD HH:MM`, Blazar's input format.
pub fn format_minute(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

/// Drops seconds and below: Blazar works in whole minutes.
pub fn floor_minute(t: DateTime<Utc>) -> DateTime<Utc> {
    t.with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(t)
}

const DURATION_HELP: &str = "use numbers with units s, m, h, d or w, such as 90m, 1h30m or 3d";

/// `3d`, `1h30m`, `90m`, `45s`, `2w` (spaces allowed between parts).
pub fn parse_duration(text: &str) -> Result<TimeDelta, String> {
    let invalid = || format!("invalid duration {text:?}: {DURATION_HELP}");
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.is_empty() {
        return Err(invalid());
    }
    let mut total = TimeDelta::zero();
    let mut rest = compact.as_str();
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid());
        }
        let number: i64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let (unit, length) = if rest.starts_with("ms") {
            (TimeDelta::milliseconds(1), 2)
        } else {
            let seconds = match rest.chars().next() {
                Some('s') => 1,
                Some('m') => 60,
                Some('h') => 3600,
                Some('d') => 86_400,
                Some('w') => 604_800,
                _ => return Err(invalid()),
            };
            (TimeDelta::seconds(seconds), 1)
        };
        rest = &rest[length..];
        let part = unit
            .checked_mul(i32::try_from(number).map_err(|_| invalid())?)
            .ok_or_else(invalid)?;
        total = total.checked_add(&part).ok_or_else(invalid)?;
    }
    Ok(total)
}

/// How a duration reads to a person: `1d 2h 3m`, `45s`.
pub fn describe_duration(d: TimeDelta) -> String {
    let mut seconds = d.num_seconds().max(0);
    if seconds == 0 {
        return format!("{}ms", d.num_milliseconds().max(0));
    }
    let mut parts = Vec::new();
    for (unit, name) in [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")] {
        if seconds >= unit {
            parts.push(format!("{}{name}", seconds / unit));
            seconds %= unit;
        }
    }
    parts.join(" ")
}

fn date_help(text: &str) -> String {
    format!(
        "invalid date {text:?}: use YYYY-MM-DD HH:MM (UTC, as Blazar), add an offset \
         (2026-12-01 18:00+01:00) or the word local (2026-12-01 18:00 local), or say now, \
         now+1h30m"
    )
}

/// The instant a relative date (`now+1h`, `+30m`, `now-2d`) names, to the second; `None`
/// when `text` is not relative.
pub fn relative_instant(text: &str, now: DateTime<Utc>) -> Option<Result<DateTime<Utc>, String>> {
    let lower = text.trim().to_ascii_lowercase();
    let relative = lower
        .strip_prefix("now")
        .or_else(|| lower.starts_with('+').then_some(lower.as_str()))?
        .trim();
    if relative.is_empty() {
        return None;
    }
    let (sign, amount) = match relative.chars().next() {
        Some('+') => (1, &relative[1..]),
        Some('-') => (-1, &relative[1..]),
        _ => return Some(Err(date_help(text))),
    };
    Some(
        parse_duration(amount)
            .map_err(|e| format!("{e} (in date {text:?})"))
            .and_then(|delta| {
                let delta = if sign < 0 { -delta } else { delta };
                now.checked_add_signed(delta).ok_or_else(|| date_help(text))
            }),
    )
}

/// A date typed by a user. `YYYY-MM-DD HH:MM` without a zone is UTC, as python-blazarclient
/// reads it, so scripts written for it keep their meaning; `local` or an offset say
/// otherwise. Relative dates count from `now`; they and dates with seconds are floored to
/// the minute, which is all Blazar stores.
pub fn parse_date(text: &str, now: DateTime<Utc>) -> Result<DateInput, String> {
    let trimmed = text.trim();
    let lower = trimmed.to_ascii_lowercase();
    if lower == "now" {
        return Ok(DateInput::Now);
    }
    if let Some(at) = relative_instant(text, now) {
        return Ok(DateInput::At(floor_minute(at?)));
    }

    let (body, zone) = if let Some(body) = lower.strip_suffix(" local") {
        (body.trim(), Zone::Local)
    } else if let Some(body) = lower
        .strip_suffix(" utc")
        .or_else(|| lower.strip_suffix('z'))
    {
        (body.trim(), Zone::Utc)
    } else {
        (lower.as_str(), Zone::Utc)
    };
    let body = body.replacen('t', " ", 1);

    // With an explicit offset.
    for format in [
        "%Y-%m-%d %H:%M%:z",
        "%Y-%m-%d %H:%M %:z",
        "%Y-%m-%d %H:%M:%S%:z",
        "%Y-%m-%d %H:%M:%S %:z",
        "%Y-%m-%d %H:%M%z",
        "%Y-%m-%d %H:%M:%S%z",
        "%Y-%m-%d %H:%M %z",
    ] {
        if let Ok(at) = DateTime::parse_from_str(&body, format) {
            return whole_minute(at.with_timezone(&Utc), text);
        }
    }
    for format in [
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M:%S%.f",
    ] {
        if let Ok(naive) = NaiveDateTime::parse_from_str(&body, format) {
            let at = match zone {
                Zone::Utc => naive.and_utc(),
                Zone::Local => Local
                    .from_local_datetime(&naive)
                    .earliest()
                    .ok_or_else(|| {
                        format!("{text:?} does not exist in the local time zone (a clock change)")
                    })?
                    .with_timezone(&Utc),
            };
            return whole_minute(at, text);
        }
    }
    if chrono::NaiveDate::parse_from_str(&body, "%Y-%m-%d").is_ok() {
        return Err(format!(
            "invalid date {text:?}: give a time too, such as \"{body} 09:00\""
        ));
    }
    Err(date_help(text))
}

enum Zone {
    Utc,
    Local,
}

fn whole_minute(at: DateTime<Utc>, text: &str) -> Result<DateInput, String> {
    if at.second() != 0 || at.nanosecond() != 0 {
        return Err(format!(
            "invalid date {text:?}: Blazar works in whole minutes; drop the seconds"
        ));
    }
    Ok(DateInput::At(at))
}

/// Parses the dates Blazar sends: `2030-01-01T10:00:00.000000` and `2030-01-01 10:00:00`.
pub fn parse_wire(text: &str) -> Option<DateTime<Utc>> {
    blazar_api::dates::parse_t(text).or_else(|| {
        NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
            .ok()
            .map(|n| n.and_utc())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
            .unwrap()
            .and_utc()
    }

    #[test]
    fn durations() {
        let cases = [
            ("45s", 45),
            ("90m", 5400),
            ("1h30m", 5400),
            ("1h 30m", 5400),
            ("3d", 259_200),
            ("2w", 1_209_600),
        ];
        for (text, seconds) in cases {
            assert_eq!(
                parse_duration(text).unwrap().num_seconds(),
                seconds,
                "{text}"
            );
        }
        assert_eq!(parse_duration("500ms").unwrap().num_milliseconds(), 500);
        for bad in ["", "1", "h", "1y", "-1h", "1.5h", "99999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(describe_duration(TimeDelta::seconds(93_784)), "1d 2h 3m 4s");
        assert_eq!(describe_duration(TimeDelta::milliseconds(300)), "300ms");
    }

    #[test]
    fn dates() {
        let now = at("2026-11-22 08:16:31");
        let cases = [
            ("now", DateInput::Now),
            ("NOW", DateInput::Now),
            ("now+1h", DateInput::At(at("2026-11-22 09:16:00"))),
            ("now + 2m", DateInput::At(at("2026-11-22 08:18:00"))),
            ("+1d", DateInput::At(at("2026-11-23 08:16:00"))),
            ("2026-12-01 18:00", DateInput::At(at("2026-12-01 18:00:00"))),
            ("2026-12-01T18:00", DateInput::At(at("2026-12-01 18:00:00"))),
            (
                "2026-12-01 18:00:00",
                DateInput::At(at("2026-12-01 18:00:00")),
            ),
            (
                "2026-12-01T18:00:00Z",
                DateInput::At(at("2026-12-01 18:00:00")),
            ),
            (
                "2026-12-01 18:00 UTC",
                DateInput::At(at("2026-12-01 18:00:00")),
            ),
            (
                "2026-12-01 18:00+01:00",
                DateInput::At(at("2026-12-01 17:00:00")),
            ),
            (
                "2026-12-01T18:00:00-05:30",
                DateInput::At(at("2026-12-01 23:30:00")),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_date(text, now), Ok(expected), "{text}");
        }
        for bad in [
            "tomorrow",
            "2026-12-01",
            "2026-12-01 18:00:30",
            "now*2",
            "2026-13-01 10:00",
        ] {
            assert!(parse_date(bad, now).is_err(), "{bad}");
        }
        assert!(
            parse_date("2026-12-01", now)
                .unwrap_err()
                .contains("give a time too")
        );
    }

    #[test]
    fn wire_dates() {
        assert_eq!(
            parse_wire("2030-01-01T10:00:00.000000"),
            Some(at("2030-01-01 10:00:00"))
        );
        assert_eq!(
            parse_wire("2026-11-22 08:16:13"),
            Some(at("2026-11-22 08:16:13"))
        );
        assert_eq!(parse_wire("soon"), None);
    }
}
