-- Per-project quota overrides an admin set. A NULL column takes the configured default;
-- -1 means no limit; 0 or more is the limit. Times and durations in seconds.
CREATE TABLE quotas (
    project_id TEXT PRIMARY KEY,
    hosts BIGINT,
    floatingips BIGINT,
    instances BIGINT,
    max_lease_duration BIGINT,
    max_start_ahead BIGINT,
    host_hours_per_month BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT
);
