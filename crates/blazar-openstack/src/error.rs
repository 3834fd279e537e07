//! Errors of calls to OpenStack services, and which of them are worth retrying.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No answer: refused, reset, timed out.
    #[error("{0}")]
    Unreachable(String),
    /// The service answered with an error status.
    #[error("{service} {request}: {status} {message}")]
    Status {
        service: String,
        request: String,
        status: u16,
        message: String,
    },
    /// The cloud is not as the action needs it and waiting will not change that (a
    /// reservation with no size to make a flavor of, servers whose host Nova will not show).
    #[error("{0}")]
    Refused(String),
    /// A reserved address or segment is held in the cloud by something of another project
    /// that blazar-rs did not make: it cannot be handed over until that goes.
    #[error("{0}")]
    HeldOutside(String),
    /// Something the action needs is not there yet, and the cloud makes it by itself (a
    /// compute node's resource provider, made when its nova-compute starts).
    #[error("{0}")]
    NotYet(String),
    #[error("{0}")]
    Auth(String),
    #[error("{0}")]
    Config(String),
    /// The service answered something we cannot read.
    #[error("{0}")]
    Decode(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Whether trying again later may succeed: no answer, the service overloaded or failing,
    /// a conflict with something in progress (Nova answers 409 while servers are still on a
    /// host it is asked to move), or credentials Keystone could not check just now.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable(_) | Error::NotYet(_) => true,
            Error::Status { status, .. } => matches!(status, 409 | 429 | 500..=599),
            Error::Refused(_)
            | Error::HeldOutside(_)
            | Error::Auth(_)
            | Error::Config(_)
            | Error::Decode(_) => false,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }
}

/// A call's outcome, with the failures `done` accepts counted as success: a 404 where
/// something is to be gone, a 409 where it is to be there (done by an earlier attempt).
pub(crate) fn tolerate<T>(result: Result<T>, done: impl Fn(&Error) -> bool) -> Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if done(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The human message in an OpenStack error body, whichever service's shape it has: Nova's
/// `{"itemNotFound": {"message": ..}}`, Placement's `{"errors": [{"detail": ..}]}`, Neutron's
/// `{"NeutronError": {"message": ..}}`, Keystone's `{"error": {"message": ..}}`; on one line
/// (see [`one_line`]).
pub fn message_of(body: &Value) -> String {
    one_line(&raw_message_of(body))
}

/// At most 300 characters of `text` on one line: markup (webob's HTML error pages, `<br />`)
/// dropped, every run of whitespace or control characters one space. Messages end up in log
/// lines and in the reasons of actions and repairs, which must stay one line each. (A tag
/// stripper this small needs no HTML parser: nothing is rendered, only left out.)
pub fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(300));
    let mut in_tag = false;
    let mut gap = false;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                gap = true;
            }
            _ if in_tag => {}
            c if c.is_whitespace() || c.is_control() => gap = true,
            c => {
                if gap && !out.is_empty() {
                    out.push(' ');
                }
                gap = false;
                out.push(c);
            }
        }
        if out.chars().count() >= 300 {
            break;
        }
    }
    out
}

fn raw_message_of(body: &Value) -> String {
    if let Some(errors) = body["errors"].as_array()
        && let Some(first) = errors.first()
    {
        return first["detail"]
            .as_str()
            .or_else(|| first["title"].as_str())
            .unwrap_or_default()
            .to_string();
    }
    if let Some(m) = body["message"].as_str() {
        return m.to_string();
    }
    if let Some(obj) = body.as_object() {
        for v in obj.values() {
            if let Some(m) = v["message"].as_str() {
                return m.to_string();
            }
        }
    }
    body.to_string().chars().take(300).collect()
}

/// An error with its causes, `: `-separated: reqwest's own says only "error sending request
/// for url (...)"; the causes say whether a name was refused, or the connection refused,
/// reset or timed out.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_of_every_service() {
        assert_eq!(
            message_of(
                &json!({"itemNotFound": {"code": 404, "message": "Aggregate 7 could not be found."}})
            ),
            "Aggregate 7 could not be found."
        );
        assert_eq!(
            message_of(
                &json!({"errors": [{"status": 409, "detail": "generation conflict", "title": "Conflict"}]})
            ),
            "generation conflict"
        );
        assert_eq!(
            message_of(&json!({"NeutronError": {"type": "x", "message": "Network n not found."}})),
            "Network n not found."
        );
        assert_eq!(
            message_of(
                &json!({"error": {"code": 401, "message": "The request you have made requires authentication."}})
            ),
            "The request you have made requires authentication."
        );
    }

    #[test]
    fn messages_are_one_line_without_markup() {
        let page = "503 Service Unavailable\n\nThe server is currently unavailable.<br /><br />\n\
                    The Keystone service is temporarily unavailable.\n\n   ";
        assert_eq!(
            one_line(page),
            "503 Service Unavailable The server is currently unavailable. The Keystone \
             service is temporarily unavailable."
        );
        assert_eq!(
            message_of(&json!({"error": {"message": "a\r\nb\tc"}})),
            "a b c"
        );
        assert_eq!(one_line(&"x".repeat(1000)).len(), 300);
    }

    #[test]
    fn what_is_worth_retrying() {
        let status = |s| Error::Status {
            service: "compute".into(),
            request: "x".into(),
            status: s,
            message: String::new(),
        };
        assert!(status(503).is_transient());
        assert!(status(409).is_transient());
        assert!(!status(404).is_transient());
        assert!(!status(400).is_transient());
        assert!(Error::Unreachable("x".into()).is_transient());
        assert!(!Error::Auth("x".into()).is_transient());
    }
}
