//! Standalone API tokens on the command line: the use cases are the service's
//! (`blazar_service::tokens`); this adds how `--expires-in` is written.

pub use blazar_service::tokens::*;

/// Parses a duration such as `90d`, `12h`, `30m` or `3600s`.
pub fn parse_duration(text: &str) -> Result<chrono::Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: i64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration such as 90d, 12h, 30m or 3600s"))?;
    let seconds = match unit {
        "s" | "" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("'{text}': the unit must be s, m, h or d")),
    };
    if n <= 0 {
        return Err(format!("'{text}': the duration must be positive"));
    }
    n.checked_mul(seconds)
        .and_then(chrono::Duration::try_seconds)
        .ok_or_else(|| format!("'{text}' is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let rows: &[(&str, Option<i64>)] = &[
            ("90d", Some(90 * 86_400)),
            ("12h", Some(43_200)),
            ("30m", Some(1_800)),
            ("3600s", Some(3_600)),
            ("45", Some(45)),
            ("0d", None),
            ("1w", None),
            ("d", None),
            ("-1h", None),
            ("99999999999999999d", None),
        ];
        for (text, expected) in rows {
            assert_eq!(
                parse_duration(text).ok().map(|d| d.num_seconds()),
                *expected,
                "{text}"
            );
        }
    }
}
