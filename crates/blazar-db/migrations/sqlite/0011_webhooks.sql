-- Webhooks: a project's (or, with no project, every project's) lease events POSTed to an
-- HTTP(S) endpoint. The secret signs each delivery (HMAC-SHA256), so it is kept as given
-- out, unlike token and feed secrets. No event types listed means every type.
CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    project_id TEXT,
    url TEXT NOT NULL,
    secret TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created_by TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX webhooks_project ON webhooks (project_id);
CREATE TABLE webhook_event_types (
    webhook_id TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_type TEXT NOT NULL,
    PRIMARY KEY (webhook_id, event_type)
);
-- One row per (webhook, notification), written in the transaction that writes the
-- notification, so a committed event is never lost to a subscriber and a rolled-back one
-- never sent. A deliverer claims due rows for a while (claimed_by, claimed_until), POSTs
-- outside any transaction and records the outcome: 'delivered', or another attempt after a
-- growing pause, or 'dead' after the configured number of attempts.
CREATE TABLE webhook_deliveries (
    webhook_id TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    notification_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    lease_id TEXT,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_attempt_at BIGINT,
    last_result TEXT,
    claimed_by TEXT,
    claimed_until BIGINT,
    -- The global request id of the API call that caused the event, sent with each attempt.
    request_id TEXT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (webhook_id, notification_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_order ON webhook_deliveries (webhook_id, lease_id, seq);
