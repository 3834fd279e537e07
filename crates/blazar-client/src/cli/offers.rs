//! `lease-offers`: when a lease request could be granted, as a table of bookable windows.

use blazar_client::time::{DateInput, parse_date, parse_duration};
use chrono::{TimeDelta, Utc};
use clap::Args;
use serde_json::{Map, Value, json};

use super::human::localize;
use super::output::{ListOutput, render_list};
use super::reservations::RequestArgs;
use super::{CliResult, Context, Failure, emit};

const COLUMNS: &[&str] = &["start_date", "end_date", "duration", "resources"];

/// Show when a lease request fits: the earliest (or longest) windows with what each
/// reservation would get. Book one with lease-create and its dates, or lease-create --earliest
#[derive(Debug, Args)]
#[command(
    mut_arg("physical_reservations", |a| a
        .help("A physical host reservation, as lease-create takes it; can be repeated")
        .value_name("min=INT,max=INT,hypervisor_properties=STR,resource_properties=STR")),
    mut_arg("reservations", |a| a.help("Any reservation, as lease-create takes it; can be repeated"))
)]
pub struct OffersArgs {
    #[command(flatten)]
    request: RequestArgs,
    /// How long the lease lasts, e.g. 3h
    #[arg(long, value_name = "DURATION", required_unless_present_any = ["min_duration", "max_duration"])]
    duration: Option<String>,
    /// The shortest acceptable window (alone: windows of exactly this length)
    #[arg(long, value_name = "DURATION", conflicts_with = "duration")]
    min_duration: Option<String>,
    /// The longest wanted window (each offer as long as fits, up to this)
    #[arg(long, value_name = "DURATION", conflicts_with = "duration")]
    max_duration: Option<String>,
    /// Earliest start (default: now)
    #[arg(long = "start-date", alias = "not-before", value_name = "DATE")]
    not_before: Option<String>,
    /// Latest end (default: 30 days after the earliest start)
    #[arg(
        long = "end-date",
        alias = "not-after",
        value_name = "DATE",
        conflicts_with = "within"
    )]
    not_after: Option<String>,
    /// Latest end as a span after the earliest start, e.g. 7d
    #[arg(long, value_name = "DURATION")]
    within: Option<String>,
    /// How many offers
    #[arg(long, default_value_t = 5)]
    limit: u32,
    /// earliest or longest first
    #[arg(long, default_value = "earliest", value_parser = ["earliest", "longest"])]
    order: String,
    #[command(flatten)]
    out: ListOutput,
}

fn minutes(option: &str, text: &str) -> CliResult<i64> {
    let span = parse_duration(text).map_err(|e| Failure::plain(format!("{option}: {e}")))?;
    let minutes = span.num_minutes();
    if minutes < 1 || span != TimeDelta::minutes(minutes) {
        return Err(Failure::plain(format!(
            "{option}: give whole minutes (at least 1m), not {text:?}"
        )));
    }
    Ok(minutes)
}

/// The search window options shared by `lease-offers` and `lease-create --earliest`, as the
/// body keys `not_before` and `not_after`.
pub fn search_window(
    not_before: Option<&str>,
    not_after: Option<&str>,
    within: Option<&str>,
) -> CliResult<Map<String, Value>> {
    let now = Utc::now();
    let bad = |e: String| Failure::plain(format!("The search window is incorrect: {e}"));
    let start = match not_before {
        Some(text) => parse_date(text, now).map_err(bad)?,
        None => DateInput::Now,
    };
    let mut body = Map::new();
    // A relative earliest start (`now+1d`) is sent to the second: the server rounds a bound
    // with seconds up to the next minute, so no window starts before it (floored here, the
    // first could start up to a minute early).
    let wire = match not_before.and_then(|text| blazar_client::time::relative_instant(text, now)) {
        Some(at) => at.map_err(bad)?.format("%Y-%m-%dT%H:%M:%S").to_string(),
        None => start.to_wire(),
    };
    body.insert("not_before".into(), Value::String(wire));
    let end = match (not_after, within) {
        (Some(text), _) => Some(parse_date(text, now).map_err(bad)?),
        (None, Some(span)) => {
            let from = start.instant(blazar_client::time::floor_minute(now));
            let until = TimeDelta::try_minutes(minutes("--within", span)?)
                .and_then(|d| from.checked_add_signed(d))
                .ok_or_else(|| Failure::plain(format!("--within: {span:?} is too long")))?;
            Some(DateInput::At(until))
        }
        (None, None) => None,
    };
    if let Some(end) = end {
        body.insert("not_after".into(), Value::String(end.to_wire()));
    }
    Ok(body)
}

/// The duration keys of a search: `duration`, or `min_duration`/`max_duration`.
pub fn durations(
    duration: Option<&str>,
    min: Option<&str>,
    max: Option<&str>,
) -> CliResult<Map<String, Value>> {
    let mut body = Map::new();
    for (key, option, text) in [
        ("duration", "--duration", duration),
        ("min_duration", "--min-duration", min),
        ("max_duration", "--max-duration", max),
    ] {
        if let Some(text) = text {
            body.insert(key.into(), json!(minutes(option, text)?));
        }
    }
    Ok(body)
}

/// One line per reservation: `physical:host: h1, h2` or `virtual:instance: h3 (x2)`.
fn summary(offer: &Value) -> String {
    let reservations = offer["reservations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    reservations
        .iter()
        .map(|r| {
            let resources: Vec<String> = r["resources"]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|x| {
                            let name = x["name"].as_str().unwrap_or_default();
                            match x["slots"].as_i64() {
                                Some(n) => format!("{name} (x{n})"),
                                None => name.to_string(),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            let kind = r["resource_type"].as_str().unwrap_or_default();
            if !resources.is_empty() {
                return format!("{kind}: {}", resources.join(", "));
            }
            // Not named (a private property picks them): how many, when that is told.
            match r["amount"].as_i64() {
                Some(n) => format!("{kind}: {n} (not named)"),
                None => format!("{kind}: not named"),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub async fn offers(ctx: &Context, args: OffersArgs) -> CliResult {
    let reservations = args.request.parse()?;
    if reservations.is_empty() {
        return Err(Failure::plain(
            "an offer needs at least one --physical-reservation or --reservation",
        ));
    }
    let mut body = search_window(
        args.not_before.as_deref(),
        args.not_after.as_deref(),
        args.within.as_deref(),
    )?;
    body.extend(durations(
        args.duration.as_deref(),
        args.min_duration.as_deref(),
        args.max_duration.as_deref(),
    )?);
    body.insert(
        "reservations".into(),
        Value::Array(reservations.into_iter().map(Value::Object).collect()),
    );
    body.insert("limit".into(), json!(args.limit));
    body.insert("order".into(), json!(args.order));
    let found: Vec<Value> = ctx
        .client
        .post("/leases/offers", "offers", &Value::Object(body))
        .await?;
    let mut rows: Vec<Map<String, Value>> = found
        .iter()
        .map(|offer| {
            let mut row = Map::new();
            row.insert("start_date".into(), offer["start_date"].clone());
            row.insert("end_date".into(), offer["end_date"].clone());
            row.insert("duration".into(), offer["duration"].clone());
            if args.out.is_human() {
                row.insert("resources".into(), Value::String(summary(offer)));
            } else {
                row.insert("resources".into(), offer["reservations"].clone());
            }
            row
        })
        .collect();
    if args.out.is_human() {
        for row in &mut rows {
            localize(row, ctx.utc);
            if let Some(minutes) = row.get("duration").and_then(Value::as_i64) {
                row.insert(
                    "duration".into(),
                    Value::String(blazar_client::time::describe_duration(TimeDelta::minutes(
                        minutes,
                    ))),
                );
            }
        }
    }
    if found.is_empty() && args.out.is_human() {
        // An empty table says nothing; say why there is none (on stderr, so scripts that
        // read the table still read an empty one).
        eprintln!(
            "No window fits the request in the search window: fewer matching resources are \
             free for that long, or there are not enough of them at all (blazar lease-create \
             --dry-run with dates explains which)."
        );
    }
    emit(&render_list(&rows, COLUMNS, &args.out)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_earliest_start_is_never_rounded_down() {
        let before = Utc::now();
        let body = search_window(Some("now+1d"), None, Some("2h")).unwrap();
        let sent = body["not_before"].as_str().unwrap();
        let at = chrono::NaiveDateTime::parse_from_str(sent, "%Y-%m-%dT%H:%M:%S")
            .unwrap()
            .and_utc();
        let asked = before + TimeDelta::days(1);
        assert!(
            at >= asked - TimeDelta::seconds(1),
            "{sent} is before {asked}"
        );
        assert!(at <= Utc::now() + TimeDelta::days(1), "{sent}");
        // A fixed date keeps Blazar's minute form.
        let body = search_window(Some("2030-01-01 10:00"), None, None).unwrap();
        assert_eq!(body["not_before"], "2030-01-01 10:00");
    }
}
