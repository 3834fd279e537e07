-- The processes that claim work (actions, notifications, webhook deliveries, tasks). Each
-- holds a lock of its own while it runs (see presence.rs); one whose lock is free is gone,
-- and its claims are ended at once instead of running out.
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    started_at BIGINT NOT NULL
);
