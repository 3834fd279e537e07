//! Dates for people: in tables, Blazar's UTC dates are shown in the local time zone with
//! their offset. Machine formats keep Blazar's values untouched, so scripts get exact data.

use std::sync::OnceLock;

use blazar_client::time::parse_wire;
use chrono::{DateTime, Local, Offset, TimeDelta, Utc};
use serde_json::{Map, Value};

/// Keys whose values are dates, at any depth (events' `time`, allocations' dates, ...).
const DATE_KEYS: &[&str] = &[
    "start_date",
    "end_date",
    "before_end_date",
    "time",
    "created_at",
    "updated_at",
    "since",
    "until",
];

/// Whether the local zone is UTC (now and half a year away, so a zone that is UTC only in
/// winter still counts as local time). Where it is, tables keep Blazar's own format and
/// match python-blazarclient's exactly.
fn local_is_utc() -> bool {
    static IS_UTC: OnceLock<bool> = OnceLock::new();
    *IS_UTC.get_or_init(|| {
        let now = Utc::now();
        [now, now + TimeDelta::days(182)]
            .iter()
            .all(|t| t.with_timezone(&Local).offset().fix().local_minus_utc() == 0)
    })
}

/// `2030-01-01 11:00:00 +01:00`.
pub fn local_text(t: DateTime<Utc>) -> String {
    t.with_timezone(&Local)
        .format("%Y-%m-%d %H:%M:%S %:z")
        .to_string()
}

/// Whether tables show local times: not with `--utc`, and not where local time is UTC.
pub fn localizing(utc: bool) -> bool {
    !utc && !local_is_utc()
}

/// Rewrites every date under [`DATE_KEYS`] in `object`, at any depth, to local time, when
/// [`localizing`].
pub fn localize(object: &mut Map<String, Value>, utc: bool) {
    if localizing(utc) {
        rewrite_object(object);
    }
}

fn rewrite_object(object: &mut Map<String, Value>) {
    for (key, item) in object.iter_mut() {
        if DATE_KEYS.contains(&key.as_str())
            && let Value::String(text) = item
        {
            if let Some(t) = parse_wire(text) {
                *text = local_text(t);
            }
        } else {
            rewrite(item);
        }
    }
}

fn rewrite(value: &mut Value) {
    match value {
        Value::Object(object) => rewrite_object(object),
        Value::Array(items) => items.iter_mut().for_each(rewrite),
        _ => {}
    }
}

/// A date for a message: local with offset, or UTC with `--utc`.
pub fn describe_date(t: DateTime<Utc>, utc: bool) -> String {
    if localizing(utc) {
        local_text(t)
    } else {
        t.format("%Y-%m-%d %H:%M UTC").to_string()
    }
}
