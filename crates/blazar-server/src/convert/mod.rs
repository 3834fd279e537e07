//! The one place where wire bodies meet domain values: `from_wire` turns request bodies (the
//! `blazar-api` request types) into what the service takes, with Blazar's checks and
//! messages; `to_wire` turns what the service answers into `blazar-api` response types.
//! Handlers build no JSON themselves.

pub mod from_wire;
pub mod to_wire;

/// A body with one key, `{"<key>": value}`, serialized straight to bytes: large lists (10,000
/// hosts) never go through an intermediate `serde_json::Value` tree. A response by itself
/// (JSON, 200 unless paired with another status).
pub struct Envelope<T>(pub &'static str, pub T);

impl<T: serde::Serialize> axum::response::IntoResponse for Envelope<T> {
    fn into_response(self) -> axum::response::Response {
        axum::Json(self).into_response()
    }
}

impl<T: serde::Serialize> serde::Serialize for Envelope<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(self.0, &self.1)?;
        map.end()
    }
}
