//! Responses as text for snapshots: what varies from run to run (ids, request ids, the times
//! records were written) replaced by placeholders, so one snapshot holds on both backends.

use std::collections::HashMap;
use std::fmt::Write;

use regex::Regex;
use reqwest::Method;
use serde_json::{Map, Value};

use crate::app::{Response, TestApp};

/// Keys whose values are the times a record was written or changed.
const RECORD_TIMES: [&str; 2] = ["created_at", "updated_at"];

/// Replaces ids by numbered placeholders, the same id by the same placeholder for as long
/// as the redactor lives, so that a snapshot still shows which object refers to which:
/// UUIDs become `[id-N]`, Keystone-style 32-digit ids `[hex-N]`, request ids `[request-id]`.
/// Record times (`created_at`, `updated_at`) become `[time]` when set, and the test
/// server's port `PORT`.
pub struct Redactor {
    ids: HashMap<String, String>,
    counts: HashMap<&'static str, usize>,
    pattern: Regex,
    port: Regex,
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor {
            ids: HashMap::new(),
            counts: HashMap::new(),
            pattern: Regex::new(
                r"(req-)?\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b[0-9a-f]{32}\b",
            )
            .unwrap(),
            port: Regex::new(r"127\.0\.0\.1:[0-9]+").unwrap(),
        }
    }
}

impl Redactor {
    /// `text` with every id in it replaced.
    pub fn text(&mut self, text: &str) -> String {
        let text = self.port.replace_all(text, "127.0.0.1:PORT");
        let text = text.as_ref();
        let mut out = String::new();
        let mut last = 0;
        let found: Vec<(usize, usize)> = self
            .pattern
            .find_iter(text)
            .map(|m| (m.start(), m.end()))
            .collect();
        for (start, end) in found {
            out.push_str(&text[last..start]);
            out.push_str(&self.placeholder(&text[start..end]));
            last = end;
        }
        out.push_str(&text[last..]);
        out
    }

    fn placeholder(&mut self, id: &str) -> String {
        if id.starts_with("req-") {
            return "[request-id]".into();
        }
        if let Some(known) = self.ids.get(id) {
            return known.clone();
        }
        let kind = if id.contains('-') { "id" } else { "hex" };
        let n = self.counts.entry(kind).or_default();
        *n += 1;
        let placeholder = format!("[{kind}-{n}]");
        self.ids.insert(id.to_string(), placeholder.clone());
        placeholder
    }

    /// `value` with every id in its strings replaced, and record times.
    pub fn value(&mut self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.value(v)).collect()),
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, v) in map {
                    let v = if RECORD_TIMES.contains(&k.as_str()) && !v.is_null() {
                        Value::String("[time]".into())
                    } else {
                        self.value(v)
                    };
                    out.insert(self.text(k), v);
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }
}

/// Requests through a [`TestApp`] and what they answered, as text for one snapshot: each
/// call as `METHOD path`, the request body if any, the status and the response body, ids
/// redacted by one [`Redactor`].
pub struct Transcript<'a> {
    app: &'a TestApp,
    redactor: Redactor,
    text: String,
}

impl<'a> Transcript<'a> {
    pub fn new(app: &'a TestApp) -> Self {
        Transcript {
            app,
            redactor: Redactor::default(),
            text: String::new(),
        }
    }

    /// Sends a request as [`TestApp::request`] does and records it.
    pub async fn call(&mut self, method: Method, path: &str, body: Option<Value>) -> Response {
        let response = self.app.request(method.clone(), path, body.clone()).await;
        self.record(&method, path, body.as_ref(), &response);
        response
    }

    pub async fn get(&mut self, path: &str) -> Response {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&mut self, path: &str, body: Value) -> Response {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn put(&mut self, path: &str, body: Value) -> Response {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn patch(&mut self, path: &str, body: Value) -> Response {
        self.call(Method::PATCH, path, Some(body)).await
    }

    pub async fn delete(&mut self, path: &str) -> Response {
        self.call(Method::DELETE, path, None).await
    }

    /// Records a call made some other way.
    pub fn record(
        &mut self,
        method: &Method,
        path: &str,
        request: Option<&Value>,
        response: &Response,
    ) {
        let path = self.redactor.text(path);
        let _ = writeln!(self.text, "{method} {path}");
        if let Some(body) = request {
            let body = self.redactor.value(body);
            let _ = writeln!(self.text, "> {body}");
        }
        let _ = writeln!(self.text, "{}", response.status);
        if !response.body.is_null() {
            let body = self.redactor.value(&response.body);
            let _ = writeln!(
                self.text,
                "{}",
                serde_json::to_string_pretty(&body).unwrap()
            );
        }
        self.text.push('\n');
    }

    /// A note in the transcript (what the test did between calls).
    pub fn note(&mut self, note: &str) {
        let _ = writeln!(self.text, "# {note}\n");
    }

    /// The redactor, to redact something else the same way.
    pub fn redactor(&mut self) -> &mut Redactor {
        &mut self.redactor
    }

    /// The transcript, for `insta::assert_snapshot!`.
    pub fn finish(self) -> String {
        self.text
    }
}
