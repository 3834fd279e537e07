//! Wire to domain: request bodies, read into `blazar-api` request types, become what the
//! service takes. Blazar's strictness and messages live here: unknown and server-managed
//! fields, missing fields and wrong types are 400s naming the field.
//!
//! Lease bodies become the service's `NewLease` and `LeaseUpdate`. The inventory use cases
//! (hosts, floating IPs, networks, devices, flavors, properties) check their bodies key by key
//! in the service, which takes them as flat maps; for those this module only hands the
//! request over as such a map.

use blazar_api::dates::{InputDate, parse_input, parse_minute, parse_t};
use blazar_core::time::{first_whole_minute, truncate_to_minute};
use blazar_core::{ReservationChange, ReservationRequest, When};
use blazar_service::{DEVICES, FLOATINGIPS, KindSpec, NETWORKS, ReallocationFilter};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};

/// Reads a JSON object into a request type. The request types read any object, so this
/// fails only on a type that does not.
pub fn read<T: DeserializeOwned>(body: Map<String, Value>) -> ApiResult<T> {
    serde_json::from_value(Value::Object(body))
        .map_err(|e| ApiError::bad_request(format!("The request body is malformed: {e}")))
}

/// A request the service checks key by key, as the flat map it takes: the body's own keys
/// first, then the others in the order they were sent.
fn flat<T: Serialize>(body: &T) -> ApiResult<Map<String, Value>> {
    match serde_json::to_value(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Ok(Map::new()),
        Err(e) => Err(ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("re-reading a request body: {e}"),
        )),
    }
}

/// Lease fields the server sets; a request naming one is refused rather than ignored.
const PROTECTED_LEASE_FIELDS: &[&str] = &[
    "id",
    "project_id",
    "user_id",
    "trust_id",
    "status",
    "degraded",
    "created_at",
    "updated_at",
];

const NEW_LEASE_FIELDS: &[&str] = &[
    "name",
    "start_date",
    "end_date",
    "before_end_date",
    "reservations",
    "events",
    "duration",
    "not_before",
    "not_after",
];

const OFFER_FIELDS: &[&str] = &[
    "reservations",
    "duration",
    "min_duration",
    "max_duration",
    "not_before",
    "not_after",
    "limit",
    "order",
    "name",
    "events",
    "before_end_date",
];

/// `start_date` of a create that books the earliest window of a search.
const EARLIEST: &str = "earliest";

const LEASE_UPDATE_FIELDS: &[&str] = &[
    "name",
    "start_date",
    "end_date",
    "before_end_date",
    "reservations",
];

/// Refuses the keys a lease body does not define (`other`), server-managed ones first.
fn check_lease_fields(other: &Map<String, Value>, accepted: &[&str]) -> ApiResult<()> {
    let (protected, unknown): (Vec<&str>, Vec<&str>) = other
        .keys()
        .map(String::as_str)
        .partition(|key| PROTECTED_LEASE_FIELDS.contains(key));
    let with_fields =
        |error: ApiError, keys: &[&str]| keys.iter().fold(error, |e, k| e.with_reason(field(k)));
    if !protected.is_empty() {
        let error = ApiError::bad_request(format!(
            "{} cannot be set: the server manages these fields",
            protected.join(", ")
        ));
        return Err(with_fields(error, &protected));
    }
    if !unknown.is_empty() {
        let error = ApiError::bad_request(format!(
            "Unknown field(s) {}; accepted fields: {}",
            unknown.join(", "),
            accepted.join(", ")
        ));
        return Err(with_fields(error, &unknown));
    }
    Ok(())
}

/// A sent value; `null` is as good as absent.
fn given(value: Option<Value>) -> Option<Value> {
    value.filter(|v| !v.is_null())
}

fn string_field(key: &str, value: Option<Value>) -> ApiResult<Option<String>> {
    match given(value) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ApiError::bad_request(format!(
            "Malformed parameter {key}: expected a string, got {other}"
        ))
        .with_reason(field(key))),
    }
}

/// The reason of a refusal about one field of the body.
fn field(key: &str) -> blazar_api::RefusalReason {
    blazar_api::RefusalReason {
        field: Some(key.to_string()),
        ..blazar_api::RefusalReason::default()
    }
}

fn invalid_date(value: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{value} is an invalid date. Required format: %Y-%m-%d %H:%M"
    ))
}

fn when_field(key: &str, value: Option<Value>) -> ApiResult<Option<When>> {
    let Some(text) = string_field(key, value)? else {
        return Ok(None);
    };
    match parse_input(&text) {
        Some(InputDate::Now) => Ok(Some(When::Now)),
        Some(InputDate::At(t)) => Ok(Some(When::At(t))),
        None => Err(invalid_date(&text)),
    }
}

/// An empty `before_end_date` is none, as in Blazar (a form's empty optional field): a
/// create gets the default notice, an update leaves the notice as it is.
fn before_end_field(value: Option<Value>) -> ApiResult<Option<DateTime<Utc>>> {
    match string_field("before_end_date", value)? {
        None => Ok(None),
        Some(text) if text.is_empty() => Ok(None),
        Some(text) => parse_minute(&text)
            .map(Some)
            .ok_or_else(|| invalid_date(&text)),
    }
}

fn reservations_field(value: Option<Value>) -> ApiResult<Option<Vec<Map<String, Value>>>> {
    match given(value) {
        None => Ok(None),
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Object(map) => Ok(map),
                other => Err(ApiError::bad_request(format!(
                    "Malformed parameter reservations: item {} must be an object, got {other}",
                    i + 1
                ))),
            })
            .collect::<ApiResult<Vec<_>>>()
            .map(Some),
        Some(other) => Err(ApiError::bad_request(format!(
            "Malformed parameter reservations: expected a list, got {other}"
        ))),
    }
}

/// `POST /v1/leases`.
pub fn new_lease(body: blazar_api::NewLease) -> ApiResult<blazar_service::NewLease> {
    check_lease_fields(&body.other, NEW_LEASE_FIELDS)?;
    let earliest =
        matches!(&body.start_date, Some(Value::String(s)) if s.eq_ignore_ascii_case(EARLIEST));
    let mut required = vec![("name", &body.name), ("start_date", &body.start_date)];
    if earliest {
        required.push(("duration", &body.duration));
    } else {
        required.push(("end_date", &body.end_date));
    }
    let missing: Vec<&str> = required
        .into_iter()
        .filter(|(_, value)| value.as_ref().is_none_or(Value::is_null))
        .map(|(key, _)| key)
        .collect();
    if !missing.is_empty() {
        let error = ApiError::bad_request(format!("Missing parameter {}", missing.join(", ")));
        return Err(missing
            .iter()
            .fold(error, |e, key| e.with_reason(field(key))));
    }
    no_custom_events(body.events)?;
    let search = if earliest {
        if given(body.end_date.clone()).is_some() {
            return Err(ApiError::bad_request(
                "end_date cannot be given with start_date \"earliest\": give the duration in \
                 minutes instead",
            ));
        }
        if before_end_field(body.before_end_date.clone())?.is_some() {
            return Err(ApiError::bad_request(
                "before_end_date cannot be given with start_date \"earliest\": the end is not \
                 known yet",
            ));
        }
        let minutes = minutes_field("duration", body.duration)?.unwrap_or_default();
        Some(blazar_service::SearchWindow {
            not_before: not_before_field(body.not_before)?,
            not_after: not_after_field(body.not_after)?,
            min_minutes: minutes,
            max_minutes: minutes,
        })
    } else {
        for (key, value) in [
            ("duration", &body.duration),
            ("not_before", &body.not_before),
            ("not_after", &body.not_after),
        ] {
            if given(value.clone()).is_some() {
                return Err(ApiError::bad_request(format!(
                    "{key} is only taken with start_date \"earliest\""
                )));
            }
        }
        None
    };
    Ok(blazar_service::NewLease {
        name: string_field("name", body.name)?.unwrap_or_default(),
        start: if earliest {
            When::Now
        } else {
            when_field("start_date", body.start_date)?.unwrap_or(When::Now)
        },
        end: when_field("end_date", body.end_date)?.unwrap_or(When::Now),
        before_end: before_end_field(body.before_end_date)?,
        reservations: ReservationRequest::read_all(
            reservations_field(body.reservations)?.unwrap_or_default(),
        ),
        earliest: search,
        user_token: None,
    })
}

/// Lease events come from the dates; a body may only send none.
fn no_custom_events(events: Option<Value>) -> ApiResult<()> {
    match given(events) {
        None => Ok(()),
        Some(Value::Array(items)) if items.is_empty() => Ok(()),
        Some(_) => Err(ApiError::bad_request(
            "Custom lease events are not supported: send \"events\": [] or leave it out; \
             the start, end and before-end events are created from the dates",
        )),
    }
}

/// `POST /v1/leases/offers`.
pub fn offer_request(body: blazar_api::OfferRequest) -> ApiResult<blazar_service::OfferRequest> {
    if let Some(date) = ["start_date", "end_date"]
        .into_iter()
        .find(|k| body.other.contains_key(*k))
    {
        return Err(ApiError::bad_request(format!(
            "Offers take no {date}: they search for the dates; give not_before and not_after \
             to bound the search"
        )));
    }
    if !body.other.is_empty() {
        let unknown: Vec<&str> = body.other.keys().map(String::as_str).collect();
        return Err(ApiError::bad_request(format!(
            "Unknown field(s) {}; accepted fields: {}",
            unknown.join(", "),
            OFFER_FIELDS.join(", ")
        )));
    }
    // Shaped as a create would take it, though an offer does not use it.
    if let Some(name) = string_field("name", body.name)? {
        blazar_service::check_name(&name)?;
    }
    // A date inside windows not found yet would hold only for some of them: refused, as
    // with `start_date: "earliest"`, rather than offering windows it does not fit.
    if before_end_field(body.before_end_date)?.is_some() {
        return Err(ApiError::bad_request(
            "before_end_date cannot be given with offers: the windows are not known yet; give it to the create of the offer you book",
        ));
    }
    no_custom_events(body.events)?;
    let reservations = reservations_field(body.reservations)?.unwrap_or_default();
    if reservations.is_empty() {
        return Err(ApiError::bad_request(
            "Missing parameter reservations: offers are for at least one reservation",
        ));
    }
    let duration = minutes_field("duration", body.duration)?;
    let min = minutes_field("min_duration", body.min_duration)?;
    let max = minutes_field("max_duration", body.max_duration)?;
    let (min_minutes, max_minutes) = match (duration, min, max) {
        (Some(d), None, None) => (d, d),
        (None, Some(min), Some(max)) => (min, max),
        (None, Some(min), None) => (min, min),
        (None, None, Some(max)) => (1, max),
        (None, None, None) => {
            return Err(ApiError::bad_request(
                "Missing parameter duration (minutes), or min_duration and max_duration",
            ));
        }
        _ => {
            return Err(ApiError::bad_request(
                "Give either duration or min_duration/max_duration, not both",
            ));
        }
    };
    // A number, or a string of one, as durations (and Blazar's amounts) are taken.
    let limit = match given(body.limit) {
        None => blazar_service::DEFAULT_OFFERS,
        Some(v) => match &v {
            Value::String(s) => s.trim().parse::<u64>().ok(),
            other => other.as_u64(),
        }
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "Malformed parameter limit: expected a positive integer, got {v}"
            ))
        })?,
    };
    let order = match string_field("order", body.order)?.as_deref() {
        None | Some("earliest") => blazar_core::offer::Order::Earliest,
        Some("longest") => blazar_core::offer::Order::Longest,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Malformed parameter order: expected earliest or longest, got {other}"
            )));
        }
    };
    Ok(blazar_service::OfferRequest {
        reservations: ReservationRequest::read_all(reservations),
        window: blazar_service::SearchWindow {
            not_before: not_before_field(body.not_before)?,
            not_after: not_after_field(body.not_after)?,
            min_minutes,
            max_minutes,
        },
        limit,
        order,
    })
}

/// A whole number of minutes (a JSON integer, or a string of digits as form fields send).
fn minutes_field(key: &str, value: Option<Value>) -> ApiResult<Option<i64>> {
    let bad = |v: &Value| {
        ApiError::bad_request(format!(
            "Malformed parameter {key}: expected a whole number of minutes, got {v}"
        ))
    };
    match given(value) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|m| *m >= 1)
            .map(Some)
            .ok_or_else(|| bad(&Value::Number(n))),
        Some(Value::String(s)) => s
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|m| *m >= 1)
            .map(Some)
            .ok_or_else(|| bad(&Value::String(s))),
        Some(other) => Err(bad(&other)),
    }
}

/// A search window's start: as a timeline's, so an offer's own printed dates can bound the
/// next search as they are. Windows are searched by the minute: seconds round up.
fn not_before_field(value: Option<Value>) -> ApiResult<Option<When>> {
    let Some(text) = string_field("not_before", value)? else {
        return Ok(None);
    };
    match parse_when(&text) {
        Some(When::At(t)) => Ok(Some(When::At(first_whole_minute(t)))),
        Some(When::Now) => Ok(Some(When::Now)),
        None => Err(invalid_date(&text)),
    }
}

/// A search window's end, in the same forms but `now`; seconds round down.
fn not_after_field(value: Option<Value>) -> ApiResult<Option<DateTime<Utc>>> {
    let Some(text) = string_field("not_after", value)? else {
        return Ok(None);
    };
    match parse_when(&text) {
        Some(When::At(t)) => Ok(Some(truncate_to_minute(t))),
        // Understood, but a search that must end now has no window to offer.
        Some(When::Now) => Err(ApiError::bad_request(
            "not_after cannot be now: the search window must end after it starts",
        )),
        None => Err(invalid_date(&text)),
    }
}

/// `PUT /v1/leases/{id}`.
pub fn lease_update(body: blazar_api::LeaseUpdate) -> ApiResult<blazar_service::LeaseUpdate> {
    check_lease_fields(&body.other, LEASE_UPDATE_FIELDS)?;
    Ok(blazar_service::LeaseUpdate {
        name: string_field("name", body.name)?,
        start: when_field("start_date", body.start_date)?,
        end: when_field("end_date", body.end_date)?,
        before_end: before_end_field(body.before_end_date)?,
        reservations: reservations_field(body.reservations)?.map(ReservationChange::read_all),
    })
}

/// `POST /v1/os-hosts`.
pub fn new_host(body: &blazar_api::NewHost) -> ApiResult<Map<String, Value>> {
    flat(body)
}

/// `PUT /v1/os-hosts/{id}`.
pub fn host_update(body: blazar_api::HostUpdate) -> Map<String, Value> {
    body.values
}

/// `POST` of a floating IP, network segment or device, read as the kind's request type.
pub fn new_resource(spec: &KindSpec, body: Map<String, Value>) -> ApiResult<Map<String, Value>> {
    if spec.kind == FLOATINGIPS.kind {
        flat(&read::<blazar_api::NewFloatingIp>(body)?)
    } else if spec.kind == NETWORKS.kind {
        flat(&read::<blazar_api::NewNetwork>(body)?)
    } else if spec.kind == DEVICES.kind {
        flat(&read::<blazar_api::NewDevice>(body)?)
    } else {
        Ok(body)
    }
}

/// `PUT` of a floating IP, network segment or device.
pub fn resource_update(body: blazar_api::ResourceUpdate) -> Map<String, Value> {
    body.values
}

/// `PATCH .../properties/{name}`.
pub fn property_update(body: &blazar_api::PropertyUpdate) -> ApiResult<Map<String, Value>> {
    flat(body)
}

/// `POST /v1/flavors`.
pub fn new_flavor(body: &blazar_api::NewFlavor) -> ApiResult<Map<String, Value>> {
    flat(body)
}

/// Chameleon's re-allocation: which reservations of the resource to move.
pub fn reallocation(body: blazar_api::Reallocation) -> ApiResult<ReallocationFilter> {
    let text = |key: &str, value: Option<Value>| -> ApiResult<Option<String>> {
        match given(value) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
            Some(other) => Err(ApiError::bad_request(format!(
                "Malformed parameter {key}: expected an id, got {other}"
            ))),
        }
    };
    if let Some(key) = body.other.keys().next() {
        return Err(ApiError::bad_request(format!(
            "Unknown field {key}; a re-allocation takes lease_id and reservation_id"
        )));
    }
    Ok(ReallocationFilter {
        lease_id: text("lease_id", body.lease_id)?,
        reservation_id: text("reservation_id", body.reservation_id)?,
    })
}

/// `POST /v1/reconcile`: whether to repair (false for a dry run), from the body or the
/// query (`dry_run` in both must agree).
pub fn reconcile(
    body: blazar_api::ReconcileRequest,
    query: &std::collections::HashMap<String, String>,
) -> ApiResult<bool> {
    let in_body = match given(body.dry_run) {
        None => None,
        Some(Value::Bool(b)) => Some(b),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Malformed parameter dry_run: expected true or false, got {other}"
            )));
        }
    };
    if let Some(key) = body.other.keys().next() {
        return Err(ApiError::bad_request(format!("Unknown field {key}")));
    }
    if let Some(key) = query.keys().find(|k| *k != "dry_run") {
        return Err(ApiError::bad_request(format!(
            "Unknown parameter {key}; a reconciliation takes dry_run"
        )));
    }
    let in_query = query
        .contains_key("dry_run")
        .then(|| crate::reply::strict_flag(query, "dry_run"))
        .transpose()?;
    let dry_run = match (in_body, in_query) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::bad_request(
                "dry_run given in the body and the query with different values",
            ));
        }
        (a, b) => a.or(b).unwrap_or(false),
    };
    Ok(!dry_run)
}

/// `GET /v1/leases/{id}/extension?end_date=...` (a create's form, or the one dates are shown
/// in) or `?prolong_for=...` (minutes, or a number followed by `m`, `h` or `d` as the CLI's
/// `--prolong-for` takes it).
pub fn extension_ask(
    query: &std::collections::HashMap<String, String>,
) -> ApiResult<blazar_service::ExtensionAsk> {
    if let Some(unknown) = query
        .keys()
        .find(|k| !matches!(k.as_str(), "end_date" | "prolong_for"))
    {
        return Err(ApiError::bad_request(format!(
            "Unknown query parameter {unknown}; accepted: end_date, prolong_for"
        )));
    }
    match (query.get("end_date"), query.get("prolong_for")) {
        (None, None) => Ok(blazar_service::ExtensionAsk::Latest),
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "Give either end_date or prolong_for, not both",
        )),
        // Also in the form leases and offers are shown in, so a shown end can be asked about
        // as it is; an update takes whole minutes, so seconds round down.
        (Some(text), None) => parse_minute(text)
            .or_else(|| parse_t(text).map(truncate_to_minute))
            .map(blazar_service::ExtensionAsk::EndAt)
            .ok_or_else(|| invalid_date(text)),
        (None, Some(text)) => span_minutes(text)
            .map(blazar_service::ExtensionAsk::ProlongBy)
            .map_err(|e| match e {
                Span::Malformed => ApiError::bad_request(format!(
                    "Malformed parameter prolong_for: expected minutes or a number followed by \
                     m, h or d, got {text}"
                )),
                Span::OutOfRange => ApiError::bad_request(format!(
                    "prolong_for must be between 1 minute and 366 days, got {text}"
                )),
            }),
    }
}

/// Why a `prolong_for` was refused: it reads as no span at all, or as one out of range.
#[derive(Debug, PartialEq)]
enum Span {
    Malformed,
    OutOfRange,
}

/// `90`, `90m`, `8h` or `2d` as minutes (at least one, at most 366 days).
fn span_minutes(text: &str) -> Result<i64, Span> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c.to_ascii_lowercase()),
        Some(_) => (text, 'm'),
        None => return Err(Span::Malformed),
    };
    let per_unit = match unit {
        'm' => 1,
        'h' => 60,
        'd' => 1440,
        _ => return Err(Span::Malformed),
    };
    let n: i64 = match number.trim().parse() {
        Ok(n) => n,
        // Digits too many for a number are a span, a very long one.
        Err(e)
            if matches!(
                e.kind(),
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
            ) =>
        {
            return Err(Span::OutOfRange);
        }
        Err(_) => return Err(Span::Malformed),
    };
    n.checked_mul(per_unit)
        .filter(|minutes| (1..=366 * 1440).contains(minutes))
        .ok_or(Span::OutOfRange)
}

/// Refuses a query string with a parameter that `what` (`a timeline`) does not take, so a
/// typo is a 400 rather than an answer to another question.
pub fn only_known(
    query: &std::collections::HashMap<String, String>,
    known: &[&str],
    what: &str,
) -> ApiResult<()> {
    let mut unknown: Vec<&str> = query
        .keys()
        .map(String::as_str)
        .filter(|k| !known.contains(k))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort_unstable();
    Err(ApiError::bad_request(format!(
        "Unknown parameter {}; {what} takes {}",
        unknown.join(", "),
        known.join(", ")
    )))
}

/// A timeline's query string: `start`, `end` (Blazar's input format, `now`, or the format
/// dates are sent in), `query`, `limit`, `marker`. Other parameters are refused, so a typo
/// does not silently show another window.
pub fn timeline_request(
    query: &std::collections::HashMap<String, String>,
) -> ApiResult<blazar_service::TimelineRequest> {
    const KNOWN: &[&str] = &["start", "end", "query", "limit", "marker"];
    only_known(query, KNOWN, "a timeline")?;
    Ok(blazar_service::TimelineRequest {
        start: query_date(query, "start")?,
        end: query_date(query, "end")?,
        query: query.get("query").filter(|q| !q.trim().is_empty()).cloned(),
        limit: query_limit(query)?,
        marker: query.get("marker").filter(|m| !m.is_empty()).cloned(),
    })
}

/// Blazar's input format, `now`, or the format dates are sent in
/// (`2030-01-01T10:00:00.000000`): what timelines and offer searches take.
fn parse_when(text: &str) -> Option<When> {
    match parse_input(text) {
        Some(InputDate::Now) => Some(When::Now),
        Some(InputDate::At(t)) => Some(When::At(t)),
        None => parse_t(text).map(When::At),
    }
}

/// A date in a query string, as [`parse_when`] reads it.
fn query_date(
    query: &std::collections::HashMap<String, String>,
    key: &str,
) -> ApiResult<Option<When>> {
    let Some(text) = query.get(key) else {
        return Ok(None);
    };
    parse_when(text).map(Some).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{text} is an invalid {key} date. Required format: %Y-%m-%d %H:%M"
        ))
    })
}

/// A page size in a query string: a positive integer.
pub fn query_limit(query: &std::collections::HashMap<String, String>) -> ApiResult<Option<usize>> {
    match query.get("limit") {
        None => Ok(None),
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(ApiError::bad_request(format!(
                "Malformed parameter limit: must be a positive integer, got {text}"
            ))),
        },
    }
}

/// An allocation list's query string: Blazar's `lease_id` and `reservation_id`, and ours,
/// `start`/`end` (leases overlapping that window, ended ones included) and `limit`/`marker`
/// (pages of resources). Other parameters are ignored, as Blazar ignores them.
pub fn allocation_list_request(
    query: &std::collections::HashMap<String, String>,
) -> ApiResult<blazar_service::AllocationListRequest> {
    let text = |key: &str| query.get(key).filter(|v| !v.is_empty()).cloned();
    Ok(blazar_service::AllocationListRequest {
        lease_id: text("lease_id"),
        reservation_id: text("reservation_id"),
        start: query_date(query, "start")?,
        end: query_date(query, "end")?,
        limit: query_limit(query)?,
        marker: text("marker"),
    })
}

/// Most actions one page of `GET /v1/actions` holds, and how many it holds unasked.
pub const ACTIONS_PAGE_MAX: usize = 1000;
pub const ACTIONS_PAGE_DEFAULT: usize = 100;

/// An action list's query string: `status` (one or several, comma-separated), `lease_id`,
/// `project_id`, `limit` and `marker` (the `seq` of the last action of the page before).
/// Other parameters are refused, so a typo does not silently list everything.
pub fn action_filter(
    query: &std::collections::HashMap<String, String>,
) -> ApiResult<blazar_core::ActionFilter> {
    use blazar_core::ActionStatus;
    const KNOWN: &[&str] = &["status", "lease_id", "project_id", "limit", "marker"];
    only_known(query, KNOWN, "an action list")?;
    let mut statuses = Vec::new();
    for word in query
        .get("status")
        .into_iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|w| !w.is_empty())
    {
        let status = word.parse::<ActionStatus>().map_err(|_| {
            let known: Vec<&str> = ActionStatus::ALL.iter().map(|s| s.as_str()).collect();
            ApiError::bad_request(format!(
                "Invalid action status {word}; use one of {}",
                known.join(", ")
            ))
        })?;
        if !statuses.contains(&status) {
            statuses.push(status);
        }
    }
    let before_seq = match query
        .get("marker")
        .map(|m| m.trim())
        .filter(|m| !m.is_empty())
    {
        None => None,
        Some(text) => Some(text.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "Malformed parameter marker: must be the seq of an action, got {text}"
            ))
        })?),
    };
    let text = |key: &str| query.get(key).filter(|v| !v.is_empty()).cloned();
    Ok(blazar_core::ActionFilter {
        statuses,
        lease_id: text("lease_id"),
        project_id: text("project_id"),
        before_seq,
        limit: query_limit(query)?
            .unwrap_or(ACTIONS_PAGE_DEFAULT)
            .min(ACTIONS_PAGE_MAX),
    })
}

/// A quota update: each key a limit's name, each value `-1` (no limit), a limit of 0 or
/// more, or `null` (back to the default). At least one key; no other keys.
pub fn quota_changes(
    body: Map<String, Value>,
) -> ApiResult<Vec<(blazar_core::quota::QuotaKind, Option<i64>)>> {
    use blazar_core::quota::QuotaKind;
    let field = |name: &str, message: String| {
        ApiError::bad_request(message).with_reason(blazar_api::RefusalReason {
            field: Some(name.to_string()),
            ..blazar_api::RefusalReason::default()
        })
    };
    if body.is_empty() {
        return Err(ApiError::bad_request(format!(
            "No quota to set: give one or more of {}",
            QuotaKind::ALL.map(QuotaKind::as_str).join(", ")
        )));
    }
    let mut changes = Vec::with_capacity(body.len());
    for (key, value) in body {
        let Some(kind) = QuotaKind::parse(&key) else {
            return Err(field(
                &key,
                format!(
                    "Unknown quota {key}: the quotas are {}",
                    QuotaKind::ALL.map(QuotaKind::as_str).join(", ")
                ),
            ));
        };
        let value = match &value {
            Value::Null => None,
            Value::Number(n) if n.as_i64().is_some_and(|v| v >= -1) => n.as_i64(),
            // A number shows as itself here, as JSON.
            other => {
                return Err(field(
                    &key,
                    format!(
                        "Invalid value {other} for quota {key}: use -1 (no limit), a whole number \
                         of 0 or more, or null (the default)"
                    ),
                ));
            }
        };
        changes.push((kind, value));
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn prolong_for_tells_a_span_out_of_range_from_a_malformed_one() {
        assert_eq!(span_minutes("90"), Ok(90));
        assert_eq!(span_minutes(" 8h"), Ok(480));
        assert_eq!(span_minutes("2D"), Ok(2880));
        assert_eq!(span_minutes("366d"), Ok(366 * 1440));
        for malformed in ["", "soon", "1.5h", "h", "8w", "-"] {
            assert_eq!(span_minutes(malformed), Err(Span::Malformed), "{malformed}");
        }
        for out in [
            "0",
            "0h",
            "-5m",
            "367d",
            "99999999999999999999",
            "9999999999999999d",
        ] {
            assert_eq!(span_minutes(out), Err(Span::OutOfRange), "{out}");
        }
    }

    fn message<T: std::fmt::Debug>(result: ApiResult<T>) -> String {
        result.unwrap_err().message
    }

    fn lease(body: Value) -> ApiResult<blazar_service::NewLease> {
        let Value::Object(map) = body else {
            panic!("not an object")
        };
        new_lease(read(map)?)
    }

    #[test]
    fn a_lease_create_names_what_is_wrong() {
        assert_eq!(
            message(lease(
                json!({"zz": 1, "status": "x", "name": "a", "id": 2, "aa": 3})
            )),
            "status, id cannot be set: the server manages these fields"
        );
        assert_eq!(
            message(lease(json!({"zz": 1, "name": "a", "aa": 3}))),
            "Unknown field(s) zz, aa; accepted fields: name, start_date, end_date, \
             before_end_date, reservations, events, duration, not_before, not_after"
        );
        assert_eq!(
            message(lease(json!({"name": "a", "start_date": null}))),
            "Missing parameter start_date, end_date"
        );
        assert_eq!(
            message(lease(
                json!({"name": 5, "start_date": "now", "end_date": "now"})
            )),
            "Malformed parameter name: expected a string, got 5"
        );
        assert_eq!(
            message(lease(
                json!({"name": "a", "start_date": "now", "end_date": "2030-01-01 10:00:00"})
            )),
            "2030-01-01 10:00:00 is an invalid date. Required format: %Y-%m-%d %H:%M"
        );
        assert_eq!(
            message(lease(
                json!({"name": "a", "start_date": "now", "end_date": "now", "reservations": [1]})
            )),
            "Malformed parameter reservations: item 1 must be an object, got 1"
        );
        assert!(
            message(lease(
                json!({"name": "a", "start_date": "now", "end_date": "now", "events": [{}]})
            ))
            .starts_with("Custom lease events are not supported")
        );
        let ok = lease(json!({
            "name": "a", "start_date": "now", "end_date": "2030-01-01 10:00",
            "before_end_date": null, "reservations": [{"resource_type": "physical:host"}],
            "events": [],
        }))
        .unwrap();
        assert_eq!(ok.name, "a");
        assert_eq!(ok.start, When::Now);
        assert_eq!(ok.before_end, None);
        assert_eq!(ok.reservations.len(), 1);
    }

    #[test]
    fn a_lease_update_takes_no_events() {
        let update: blazar_api::LeaseUpdate = read(
            json!({"events": [], "name": "b"})
                .as_object()
                .unwrap()
                .clone(),
        )
        .unwrap();
        assert_eq!(
            message(lease_update(update)),
            "Unknown field(s) events; accepted fields: name, start_date, end_date, \
             before_end_date, reservations"
        );
    }

    #[test]
    fn bodies_the_service_checks_keep_every_key_sent() {
        let body = json!({"vcpus": "x", "name": null, "hypervisor_hostname": "h", "gpu": null});
        let host: blazar_api::NewHost = read(body.as_object().unwrap().clone()).unwrap();
        let flat = new_host(&host).unwrap();
        assert_eq!(flat.get("name"), Some(&Value::Null), "a sent null stays");
        assert_eq!(flat.len(), 4);
        let property: blazar_api::PropertyUpdate =
            read(json!({"private": null}).as_object().unwrap().clone()).unwrap();
        assert_eq!(
            Value::Object(property_update(&property).unwrap()),
            json!({"private": null})
        );
    }

    #[test]
    fn reallocations_and_reconciles_refuse_other_keys() {
        let read_map = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            message(reallocation(
                read(read_map(json!({"lease_id": "l", "x": 1}))).unwrap()
            )),
            "Unknown field x; a re-allocation takes lease_id and reservation_id"
        );
        let filter = reallocation(read(read_map(json!({"lease_id": " l "}))).unwrap()).unwrap();
        assert_eq!(filter.lease_id.as_deref(), Some("l"));
        let none = std::collections::HashMap::new();
        let query = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let body = |v: Value| read(read_map(v)).unwrap();
        assert_eq!(
            message(reconcile(body(json!({"dry_run": "yes"})), &none)),
            "Malformed parameter dry_run: expected true or false, got \"yes\""
        );
        assert!(!reconcile(body(json!({"dry_run": true})), &none).unwrap());
        assert!(reconcile(body(json!({})), &none).unwrap());
        // In the query, as lease creates take it; a misspelt one is refused, not repaired.
        assert!(!reconcile(body(json!({})), &query(&[("dry_run", "true")])).unwrap());
        assert!(reconcile(body(json!({})), &query(&[("dry_run", "false")])).unwrap());
        assert_eq!(
            message(reconcile(body(json!({})), &query(&[("dry-run", "true")]))),
            "Unknown parameter dry-run; a reconciliation takes dry_run"
        );
        assert_eq!(
            message(reconcile(
                body(json!({"dry_run": false})),
                &query(&[("dry_run", "true")])
            )),
            "dry_run given in the body and the query with different values"
        );
    }
}
