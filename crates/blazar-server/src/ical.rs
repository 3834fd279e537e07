//! Calendar feeds (ours): `/v1/ical-feeds` to create, list and delete them, and the public
//! `/ical/<id>_<secret>.ics` that calendar applications subscribe to, an iCalendar
//! (RFC 5545) document with one event per lease of the feed's project.

use axum::Router;
use axum::extract::State;

use crate::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use blazar_core::{IcalFeed, LeaseView};
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::convert::{Envelope, to_wire};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Caller, JsonObject};
use crate::state::AppState;

/// The public document route, outside `/v1` and its authentication: the URL is the secret.
pub fn routes() -> Router<AppState> {
    Router::new().route("/ical/{feed}", get(feed_document))
}

pub async fn list_feeds(
    State(state): State<AppState>,
    Caller(identity): Caller,
) -> ApiResult<impl IntoResponse> {
    let feeds: Vec<_> = state
        .service
        .list_ical_feeds(&identity)
        .await?
        .into_iter()
        .map(|f| to_wire::ical_feed(f, None))
        .collect();
    Ok(Envelope("ical_feeds", feeds))
}

pub async fn create_feed(
    State(state): State<AppState>,
    Caller(identity): Caller,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let text = |key: &str| -> ApiResult<Option<String>> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::bad_request(format!("{key} must be a string"))),
        }
    };
    if let Some(key) = body
        .keys()
        .find(|k| !["project_id", "description"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field {key}: a feed takes project_id and description"
        )));
    }
    let issued = state
        .service
        .create_ical_feed(
            &identity,
            text("project_id")?,
            text("description")?.unwrap_or_default(),
        )
        .await?;
    let wire = to_wire::ical_feed(issued.feed, Some(issued.path));
    Ok(crate::reply::created("ical_feed", wire))
}

pub async fn delete_feed(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(feed_id): Path<String>,
) -> ApiResult<Response> {
    state.service.delete_ical_feed(&identity, &feed_id).await?;
    Ok(crate::reply::no_content())
}

async fn feed_document(
    State(state): State<AppState>,
    Path(feed): Path<String>,
    request: axum::http::HeaderMap,
) -> ApiResult<Response> {
    let (feed, leases) = state.service.ical_feed_leases(&feed).await?;
    // Calendar applications poll: the same leases give the same bytes, so a poll that
    // finds nothing changed is a 304.
    let body = render(&feed, &leases);
    Ok(crate::reply::revalidated(&request, body, |headers| {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/calendar; charset=utf-8"),
        );
        // Who holds what, when: not for shared caches.
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("private, no-cache"),
        );
    }))
}

/// The iCalendar document of a feed: one VEVENT per lease, from its start to its end.
pub fn render(feed: &IcalFeed, leases: &[LeaseView]) -> String {
    let mut doc = Document::default();
    doc.line("BEGIN:VCALENDAR");
    doc.line("VERSION:2.0");
    doc.line("PRODID:-//blazar-rs//lease calendar//EN");
    doc.line("CALSCALE:GREGORIAN");
    doc.line("METHOD:PUBLISH");
    doc.line(&format!(
        "X-WR-CALNAME:{}",
        escape(&format!("Leases of project {}", feed.project_id))
    ));
    if !feed.description.is_empty() {
        doc.line(&format!("X-WR-CALDESC:{}", escape(&feed.description)));
    }
    // How often a calendar application should look again.
    doc.line("REFRESH-INTERVAL;VALUE=DURATION:PT15M");
    doc.line("X-PUBLISHED-TTL:PT15M");
    for view in leases {
        let lease = &view.lease;
        doc.line("BEGIN:VEVENT");
        doc.line(&format!("UID:{}@blazar-rs", lease.id));
        // When the lease was last revised (RFC 5545 for a published calendar), not when
        // the feed was read: an unchanged lease reads the same.
        doc.line(&format!(
            "DTSTAMP:{}",
            stamp(lease.updated_at.unwrap_or(lease.created_at))
        ));
        doc.line(&format!("DTSTART:{}", stamp(lease.start)));
        doc.line(&format!("DTEND:{}", stamp(lease.end)));
        doc.line(&format!("SUMMARY:{}", escape(&lease.name)));
        let mut description = format!(
            "Lease {} ({})\nStatus: {}{}",
            lease.name,
            lease.id,
            lease.status.as_str(),
            if lease.degraded { ", degraded" } else { "" }
        );
        for r in &view.reservations {
            // What was granted stays the figure after a loss; whether it is all still there
            // is the reservation's `missing_resources`.
            description.push_str(&format!(
                "\n{}: {} granted{}",
                r.spec.resource_type(),
                r.granted_units,
                if r.missing_resources {
                    ", some of it lost"
                } else {
                    ""
                }
            ));
        }
        doc.line(&format!("DESCRIPTION:{}", escape(&description)));
        doc.line(&format!("CATEGORIES:{}", escape(lease.status.as_str())));
        doc.line(&format!(
            "LAST-MODIFIED:{}",
            stamp(lease.updated_at.unwrap_or(lease.created_at))
        ));
        doc.line("TRANSP:OPAQUE");
        doc.line("END:VEVENT");
    }
    if leases.is_empty() {
        // A calendar holds at least one component (RFC 5545, 3.6): with no lease, the zone
        // its times are in.
        for line in [
            "BEGIN:VTIMEZONE",
            "TZID:UTC",
            "BEGIN:STANDARD",
            "DTSTART:19700101T000000",
            "TZOFFSETFROM:+0000",
            "TZOFFSETTO:+0000",
            "TZNAME:UTC",
            "END:STANDARD",
            "END:VTIMEZONE",
        ] {
            doc.line(line);
        }
    }
    doc.line("END:VCALENDAR");
    doc.0
}

/// UTC date-time in iCalendar's form, `20300101T100000Z`.
fn stamp(t: DateTime<Utc>) -> String {
    t.format("%Y%m%dT%H%M%SZ").to_string()
}

/// A TEXT value with iCalendar's escapes (backslash, `;`, `,` and line breaks); a tab is
/// kept (TEXT allows it), other control characters are not.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push_str("\\\\"),
            ';' => out.push_str("\\;"),
            ',' => out.push_str("\\,"),
            '\n' => out.push_str("\\n"),
            // A line break however written: CRLF, or a CR alone (old Mac text).
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push_str("\\n");
                }
            }
            '\t' => out.push('\t'),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// Content lines joined by CRLF, each folded to at most 75 octets (RFC 5545, 3.1): a longer
/// line goes on in lines that start with a space, never splitting a character.
#[derive(Default)]
struct Document(String);

impl Document {
    fn line(&mut self, line: &str) {
        let mut room = 75;
        let mut used = 0;
        for c in line.chars() {
            if used + c.len_utf8() > room {
                self.0.push_str("\r\n ");
                // The leading space counts toward the continuation line's 75.
                room = 74;
                used = 0;
            }
            self.0.push(c);
            used += c.len_utf8();
        }
        self.0.push_str("\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_folded_at_75_octets_without_splitting_characters() {
        let mut doc = Document::default();
        let text = format!("SUMMARY:{}", "é".repeat(100));
        doc.line(&text);
        for line in doc.0.split("\r\n").filter(|l| !l.is_empty()) {
            assert!(line.len() <= 75, "{} octets: {line}", line.len());
        }
        let unfolded = doc.0.replace("\r\n ", "");
        assert_eq!(unfolded, format!("{text}\r\n"));
    }

    #[test]
    fn a_calendar_without_leases_still_holds_a_component() {
        let feed = IcalFeed {
            id: "f".into(),
            secret_sha256: String::new(),
            project_id: "p".into(),
            description: String::new(),
            created_by: None,
            created_at: DateTime::UNIX_EPOCH,
        };
        let text = render(&feed, &[]);
        let zone = text.find("BEGIN:VTIMEZONE").expect("a component");
        assert!(zone < text.find("END:VCALENDAR").unwrap());
        assert!(text.contains("END:VTIMEZONE\r\n"));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a;b,c\\d\ne"), "a\\;b\\,c\\\\d\\ne");
        assert_eq!(escape("build\tnightly\u{7}"), "build\tnightly");
        // Every way of writing a line break is one escaped break.
        assert_eq!(escape("a\r\nb\rc\nd\r"), "a\\nb\\nc\\nd\\n");
    }
}
