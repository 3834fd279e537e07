-- What the outside world must be made to do, recorded in the transaction that decided it and
-- carried out by workers after commit. An action is open while pending or running; a later
-- action of the same lease, or on one of the same resources, waits until the earlier one is
-- no longer open, so effects happen in the order they were decided. A running action whose
-- claim expired (its worker died) is claimed again: every action is safe to run twice.
CREATE TABLE actions (
    seq BIGSERIAL PRIMARY KEY,
    lease_id TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    purpose TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    -- JSON: the resources (ids and names), the reservation's parameters, the lease window.
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    not_before BIGINT NOT NULL,
    claimed_by TEXT,
    claimed_until BIGINT,
    last_error TEXT,
    -- The request id of the API call (or the event) that caused it, sent on outbound calls.
    request_id TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT
);
CREATE INDEX actions_open ON actions (status, not_before, seq);
CREATE INDEX actions_lease ON actions (lease_id, seq);

CREATE TABLE action_resources (
    seq BIGINT NOT NULL REFERENCES actions (seq) ON DELETE CASCADE,
    resource_type TEXT NOT NULL,
    resource_id BIGINT NOT NULL,
    PRIMARY KEY (seq, resource_type, resource_id)
);
CREATE INDEX action_resources_resource ON action_resources (resource_type, resource_id, seq);
