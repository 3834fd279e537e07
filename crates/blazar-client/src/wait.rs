//! Waiting for a lease to reach a status (`ACTIVE` after it starts, `TERMINATED` after it
//! ends), and telling early when it never will.

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

/// Polls `GET /v1/leases/{id}` every `poll` until the lease is `target`, can no longer
/// become it, is deleted, or `timeout` passes; `progress` sees every state read.
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
    loop {
        let lease: Map<String, Value> = match client.get(&path, "lease").await {
            Ok(lease) => lease,
            Err(e) if is_not_found(&e) => return Ok(WaitOutcome::Deleted),
            Err(e) => return Err(e),
        };
        progress(&lease);
        match judge(target, status_of(&lease)) {
            Judgement::Reached => return Ok(WaitOutcome::Reached(lease)),
            Judgement::Unreachable => return Ok(WaitOutcome::Unreachable(lease)),
            Judgement::KeepWaiting => {}
        }
        let elapsed = started.elapsed();
        if let Some(limit) = timeout {
            if elapsed >= limit {
                return Ok(WaitOutcome::TimedOut(lease));
            }
            tokio::time::sleep(poll.min(limit - elapsed)).await;
        } else {
            tokio::time::sleep(poll).await;
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
