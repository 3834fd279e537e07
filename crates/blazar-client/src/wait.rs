//! Waiting for a lease to reach a status (`ACTIVE` after it starts, `TERMINATED` after it
//! ends), and telling early when it never will: with the server's long poll where it has
//! one, else by reading the lease again and again.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::client::{Client, is_not_found, segment};
use crate::error::Result;

/// How a wait ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitOutcome {
    /// The lease reached the status; its last state.
    Reached(Map<String, Value>),
    /// The lease is in a state from which the status cannot be reached (`ERROR`, or past
    /// it: `TERMINATED` when waiting for `ACTIVE`).
    Unreachable(Map<String, Value>),
    /// The lease was deleted while waiting.
    Deleted,
    /// Time ran out; the lease's last state.
    TimedOut(Map<String, Value>),
}

/// What one observation of the status means for a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    Reached,
    KeepWaiting,
    Unreachable,
}

/// Where a status sits in a lease's life; transient statuses that can lead anywhere
/// (`UPDATING`, `DELETING`) have no rank.
fn rank(status: &str) -> Option<u8> {
    match status {
        "CREATING" => Some(0),
        "PENDING" => Some(1),
        "STARTING" => Some(2),
        "ACTIVE" => Some(3),
        "TERMINATING" => Some(4),
        "TERMINATED" => Some(5),
        _ => None,
    }
}

/// Whether `current` means the wait for `target` is over, and how.
pub fn judge(target: &str, current: &str) -> Judgement {
    if current.eq_ignore_ascii_case(target) {
        return Judgement::Reached;
    }
    if current == "ERROR" {
        return Judgement::Unreachable;
    }
    match (rank(current), rank(&target.to_ascii_uppercase())) {
        (Some(now), Some(wanted)) if now > wanted => Judgement::Unreachable,
        _ => Judgement::KeepWaiting,
    }
}

/// The `status` of a lease object.
pub fn status_of(lease: &Map<String, Value>) -> &str {
    lease.get("status").and_then(Value::as_str).unwrap_or("")
}

/// The longest one long poll asks the server to wait; shorter than any proxy's idle
/// timeout a site is likely to have.
const LONG_POLL: Duration = Duration::from_secs(55);

/// How the server answers waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Not known yet: the first request asks for a long poll.
    Unknown,
    /// `?wait_for=` answered with `Blazar-Wait-For`: the server waits, no sleep between.
    LongPoll,
    /// A server without long polls (Blazar): plain reads every `poll`.
    Poll,
}

/// Waits until the lease is `target`, can no longer become it, is deleted, or `timeout`
/// passes; `progress` sees every state read. Asks the server to wait
/// (`GET /v1/leases/{id}?wait_for=...&timeout=...`, answered as soon as the status is
/// reached); a server that does not (it answers without `Blazar-Wait-For`, or refuses the
/// parameters) is read every `poll` instead. A server with too many waiters (503) is asked
/// again after `poll`.
pub async fn wait_for_lease(
    client: &Client,
    lease_id: &str,
    target: &str,
    timeout: Option<Duration>,
    poll: Duration,
    mut progress: impl FnMut(&Map<String, Value>),
) -> Result<WaitOutcome> {
    let started = tokio::time::Instant::now();
    let path = format!("/leases/{}", segment(lease_id));
    let mut mode = Mode::Unknown;
    loop {
        let remaining = timeout.map(|limit| limit.saturating_sub(started.elapsed()));
        let read = match mode {
            Mode::Poll => client.get(&path, "lease").await.map(|lease| (lease, false)),
            Mode::Unknown | Mode::LongPoll => {
                let wait = remaining.unwrap_or(LONG_POLL).min(LONG_POLL);
                let asked = format!(
                    "{path}?wait_for={}&timeout={:.3}",
                    target.to_ascii_uppercase(),
                    wait.as_secs_f64()
                );
                match client.get_with_headers(&asked, "lease").await {
                    Ok((headers, lease)) => Ok((lease, headers.contains_key("blazar-wait-for"))),
                    Err(e) if e.status() == Some(reqwest::StatusCode::SERVICE_UNAVAILABLE) => {
                        tokio::time::sleep(poll).await;
                        continue;
                    }
                    Err(e) if e.status() == Some(reqwest::StatusCode::BAD_REQUEST) => {
                        mode = Mode::Poll;
                        continue;
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let (lease, waited): (Map<String, Value>, bool) = match read {
            Ok(read) => read,
            Err(e) if is_not_found(&e) => return Ok(WaitOutcome::Deleted),
            Err(e) => return Err(e),
        };
        if mode == Mode::Unknown {
            mode = if waited { Mode::LongPoll } else { Mode::Poll };
        }
        progress(&lease);
        match judge(target, status_of(&lease)) {
            Judgement::Reached => return Ok(WaitOutcome::Reached(lease)),
            Judgement::Unreachable => return Ok(WaitOutcome::Unreachable(lease)),
            Judgement::KeepWaiting => {}
        }
        let elapsed = started.elapsed();
        if let Some(limit) = timeout
            && elapsed >= limit
        {
            return Ok(WaitOutcome::TimedOut(lease));
        }
        if mode != Mode::LongPoll {
            let pause = timeout.map_or(poll, |limit| poll.min(limit - elapsed));
            tokio::time::sleep(pause).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judgements() {
        use Judgement::*;
        let cases = [
            ("ACTIVE", "ACTIVE", Reached),
            ("ACTIVE", "PENDING", KeepWaiting),
            ("ACTIVE", "STARTING", KeepWaiting),
            ("ACTIVE", "UPDATING", KeepWaiting),
            ("ACTIVE", "ERROR", Unreachable),
            ("ACTIVE", "TERMINATED", Unreachable),
            ("ACTIVE", "TERMINATING", Unreachable),
            ("TERMINATED", "ACTIVE", KeepWaiting),
            ("TERMINATED", "TERMINATED", Reached),
            ("PENDING", "ACTIVE", Unreachable),
            ("ERROR", "ERROR", Reached),
            ("active", "ACTIVE", Reached),
        ];
        for (target, current, expected) in cases {
            assert_eq!(judge(target, current), expected, "{target} <- {current}");
        }
    }
}
